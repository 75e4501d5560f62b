//! Secrets never reach the log, at any level. Pingora's own trace output prints request
//! headers and URIs whole, so the log writer itself redacts every line before it is written:
//! `Bearer` tokens (the client's key and the pool's credential), the values of `x-api-key`,
//! `api-key`, `cookie` and `set-cookie` headers, and key-like query parameters.

use std::io::Write;

use tracing_subscriber::fmt::MakeWriter;

const REDACTED: &str = "[redacted]";

/// Header names whose values are secrets wherever they are printed (`"name": "value"`).
const SECRET_HEADERS: [&str; 6] = [
    "\"x-api-key\": \"",
    "\"api-key\": \"",
    "\"cookie\": \"",
    "\"set-cookie\": \"",
    "\"proxy-authorization\": \"",
    "\"authorization\": \"",
];

/// The same headers as written on the wire (`name: value\r\n`), as Pingora's trace output
/// prints request bytes: the value runs to the end of the line (a CR or LF, or its escaped
/// form `\r` in a debug-printed byte string).
const SECRET_WIRE_HEADERS: [&str; 6] = [
    "x-api-key:",
    "api-key:",
    "cookie:",
    "set-cookie:",
    "proxy-authorization:",
    "authorization:",
];

/// Query parameters that may carry a key (`?api_key=…`).
const SECRET_PARAMS: [&str; 5] = [
    "api_key=",
    "access_token=",
    "token=",
    "key=",
    "authorization=",
];

fn token_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'~' | b'+' | b'/' | b'=')
}

/// `Bearer <token>`, any case: the token redacted.
fn redact_bearer(out: &mut String) {
    let mut from = 0;
    while let Some(i) = out[from..]
        .to_ascii_lowercase()
        .find("bearer ")
        .map(|i| i + from)
    {
        let start = i + "bearer ".len();
        let end = start
            + out.as_bytes()[start..]
                .iter()
                .take_while(|&&c| token_char(c))
                .count();
        if end > start {
            out.replace_range(start..end, REDACTED);
        }
        from = start + if end > start { REDACTED.len() } else { 0 };
    }
}

/// The line with every secret replaced by `[redacted]`.
pub fn redact(line: &str) -> String {
    let mut out = line.to_string();
    redact_bearer(&mut out);
    for name in SECRET_HEADERS {
        let mut from = 0;
        while let Some(i) = out[from..]
            .to_ascii_lowercase()
            .find(name)
            .map(|i| i + from)
        {
            let start = i + name.len();
            let end = start + out[start..].find('"').unwrap_or(out.len() - start);
            if out[start..end] != *REDACTED && !out[start..end].starts_with("Bearer [redacted]") {
                out.replace_range(start..end, REDACTED);
            }
            from = start + REDACTED.len().min(out.len() - start);
        }
    }
    for name in SECRET_WIRE_HEADERS {
        let mut from = 0;
        while let Some(i) = out[from..]
            .to_ascii_lowercase()
            .find(name)
            .map(|i| i + from)
        {
            // A header name starts a line: after `\n` (raw or escaped) or the string's start.
            let at_line_start = i == 0
                || out.as_bytes()[i - 1] == b'\n'
                || out[..i].ends_with("\\n")
                || out[..i].ends_with("b\"");
            let mut start = i + name.len();
            start += out.as_bytes()[start..]
                .iter()
                .take_while(|&&c| c == b' ')
                .count();
            let end = start
                + out.as_bytes()[start..]
                    .iter()
                    .take_while(|&&c| !matches!(c, b'\r' | b'\n' | b'\\' | b'"'))
                    .count();
            let value = &out[start..end];
            let done = value == REDACTED || value.starts_with("Bearer [redacted]");
            if at_line_start && end > start && !done {
                out.replace_range(start..end, REDACTED);
                from = start + REDACTED.len();
            } else {
                from = end.max(i + name.len());
            }
        }
    }
    // A key where no name announces it (pasted in a path, say `/v1/models/sk-…`, which a
    // trace prints whole): `sk-` and at least 20 more key characters, as every key
    // `modelgate key new` makes and the providers' keys look.
    let mut from = 0;
    while let Some(i) = out[from..].find("sk-").map(|i| i + from) {
        let start = i + "sk-".len();
        let end = start
            + out.as_bytes()[start..]
                .iter()
                .take_while(|&&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
                .count();
        let begins_token = i == 0 || {
            let c = out.as_bytes()[i - 1];
            !(c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
        };
        if begins_token && end - start >= 20 {
            out.replace_range(i..end, REDACTED);
            from = i + REDACTED.len();
        } else {
            from = start;
        }
    }
    for param in SECRET_PARAMS {
        let mut from = 0;
        while let Some(i) = out[from..].find(param).map(|i| i + from) {
            let start = i + param.len();
            let preceded = i > 0 && matches!(out.as_bytes()[i - 1], b'?' | b'&');
            let end = start
                + out.as_bytes()[start..]
                    .iter()
                    .take_while(|&&c| !matches!(c, b'&' | b' ' | b'"' | b',' | b'\n' | b'}'))
                    .count();
            if preceded && end > start {
                out.replace_range(start..end, REDACTED);
                from = start + REDACTED.len();
            } else {
                from = start;
            }
        }
    }
    out
}

/// The tracing writer: each event is collected whole, redacted, and written to stderr at once.
pub struct RedactingStderr;

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter(Vec::with_capacity(256))
    }
}

pub struct EventWriter(Vec<u8>);

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if self.0.is_empty() || client_noise(&self.0) {
            return;
        }
        let line = redact(&String::from_utf8_lossy(&self.0));
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// Pingora's ERROR for each connection whose client left or stalled before its request header
/// was whole ("Fail to proxy: Downstream …"): anyone could write the gateway's log at ERROR at
/// will, where an operator looks for the gateway's own faults; those lines are left out (the
/// header deadline and its 400s have their own metrics). Done here, on lines written, so the
/// log's level filter keeps its fast path (a filter of events costs every callsite).
fn client_noise(line: &[u8]) -> bool {
    memchr::memmem::find(line, b" ERROR ").is_some()
        && memchr::memmem::find(line, b"pingora_proxy: Fail to proxy: Downstream ").is_some()
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_client_that_left_before_its_header_is_no_error_line() {
        assert!(super::client_noise(b"2026-11-26T03:28:58.345329Z ERROR pingora_proxy: Fail to proxy: Downstream ConnectionClosed context: while reading request headers, bytes already read: 18, downstream session type: h1\n"));
        assert!(!super::client_noise(b"2026-11-26T03:28:58.345329Z ERROR pingora_proxy: Fail to proxy: Upstream ConnectRefused\n"));
        assert!(!super::client_noise(
            b"2026-11-26T03:28:58.345329Z  INFO modelgate: Fail to proxy: Downstream\n"
        ));
    }

    #[test]
    fn keys_tokens_and_cookies_are_redacted_and_the_rest_kept() {
        let line = r#"Request header: Parts { uri: /v1/chat/completions?api_key=sk-abc&x=1, headers: {"authorization": "Bearer sk-test-1", "x-api-key": "sk-xyz", "cookie": "modelgate_session=s3cr3t", "host": "h"} }"#;
        let r = redact(line);
        for secret in ["sk-abc", "sk-test-1", "sk-xyz", "s3cr3t"] {
            assert!(!r.contains(secret), "{r}");
        }
        assert!(r.contains("x=1") && r.contains("\"host\": \"h\""), "{r}");
        assert_eq!(redact("BEARER abc.def"), "BEARER [redacted]");
        // A key in a path or anywhere else, announced by nothing.
        let key = "sk-Ab3_dEf-9hIjKlMnOpQrStUvWxYz0123456789abcdefgh";
        for line in [
            format!("uri: /v1/models/{key}, version: HTTP/1.1"),
            format!("GET /v1/{key}?start={key} HTTP/1.1"),
        ] {
            let r = redact(&line);
            assert!(!r.contains("Ab3_dEf"), "{r}");
        }
        // Not a key: too short, or inside a word.
        assert_eq!(redact("task-sk-abc"), "task-sk-abc");
        assert_eq!(
            redact("risk-assessment-12345678901234567890"),
            "risk-assessment-12345678901234567890"
        );
        assert_eq!(
            redact("no secrets here, monkey=1"),
            "no secrets here, monkey=1"
        );
        assert_eq!(redact("a bearer "), "a bearer ");
        let wire = r#"Writing request header: b"POST /v1/messages HTTP/1.1\r\nHost: h\r\nx-api-key: sk-ant-1\r\nCookie: s=2\r\nmy-x-api-key: kept\r\n\r\n""#;
        let r = redact(wire);
        assert!(!r.contains("sk-ant-1") && !r.contains("s=2"), "{r}");
        assert!(
            r.contains("x-api-key: [redacted]") && r.contains("Host: h"),
            "{r}"
        );
        assert!(
            r.contains("my-x-api-key: kept"),
            "only whole header names: {r}"
        );
        assert_eq!(
            redact("x-api-key: abc\nnext"),
            "x-api-key: [redacted]\nnext"
        );
    }
}
