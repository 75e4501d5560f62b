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

/// The line with every secret replaced by `[redacted]`.
pub fn redact(line: &str) -> String {
    let mut out = line.to_string();
    // `Bearer <token>`, any case.
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
        if self.0.is_empty() {
            return;
        }
        let line = redact(&String::from_utf8_lossy(&self.0));
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn keys_tokens_and_cookies_are_redacted_and_the_rest_kept() {
        let line = r#"Request header: Parts { uri: /v1/chat/completions?api_key=sk-abc&x=1, headers: {"authorization": "Bearer sk-test-1", "x-api-key": "sk-xyz", "cookie": "modelgate_session=s3cr3t", "host": "h"} }"#;
        let r = redact(line);
        for secret in ["sk-abc", "sk-test-1", "sk-xyz", "s3cr3t"] {
            assert!(!r.contains(secret), "{r}");
        }
        assert!(r.contains("x=1") && r.contains("\"host\": \"h\""), "{r}");
        assert_eq!(redact("BEARER abc.def"), "BEARER [redacted]");
        assert_eq!(
            redact("no secrets here, monkey=1"),
            "no secrets here, monkey=1"
        );
        assert_eq!(redact("a bearer "), "a bearer ");
    }
}
