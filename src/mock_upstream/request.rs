//! Request side of the mock: the server options overridden by `x-mock-*` request headers,
//! reading the body (hashed, bounded) and decoding it as JSON or multipart, and the `x-mock-*`
//! echo headers that report what arrived.

use std::str::FromStr;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use pingora_core::protocols::http::ServerSession;
use pingora_http::ResponseHeader;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::MockOptions;

/// Largest request body buffered in memory; bigger bodies are drained and refused with 413.
pub(super) const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Upper bound for `chunks` (option or `x-mock-chunks`), to keep replies bounded.
const MAX_CHUNKS: usize = 100_000;
/// Upper bound for `x-mock-pad-bytes`.
const MAX_PAD_BYTES: usize = 64 * 1024 * 1024;

/// Upper bound for `delay_ms` (option or `x-mock-delay-ms`).
const MAX_DELAY_MS: u64 = 60_000;

/// Per-request settings: the server options overridden by `x-mock-*` request headers.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Overrides {
    pub(super) chunks: usize,
    pub(super) delay_ms: u64,
    pub(super) split: Option<usize>,
    pub(super) status: Option<u16>,
    pub(super) ignore_include_usage: bool,
    pub(super) garbage: bool,
    /// `x-mock-cut-after: N`: a stream stops after N events and the connection drops.
    pub(super) cut_after: Option<usize>,
    /// `x-mock-empty-body: 1`: a forced error (`x-mock-status`) comes with no body at all.
    pub(super) empty_body: bool,
    /// `x-mock-text-body: 1`: a forced error comes with an HTML page, as a proxy in front of a
    /// model server sends.
    pub(super) text_body: bool,
    /// `x-mock-retry-after: S`: a forced error carries `Retry-After: S`.
    pub(super) retry_after: Option<u64>,
    /// `x-mock-usage-shape`: where a stream's usage goes (see `stream::UsageShape`).
    pub(super) usage_shape: super::stream::UsageShape,
    /// `x-mock-usage: JSON`: the `usage` a chat or completions reply (plain or streamed) says,
    /// in place of its true counts: what a broken server sends.
    pub(super) usage: Option<serde_json::Value>,
    /// `x-mock-informational: N` (100–199): an `N` header goes first (`103 Early Hints`, say);
    /// `101` is then the only header, as from a server switching protocols.
    pub(super) informational: Option<u16>,
    /// `x-mock-html: 1`: a 200 with a web page where the API's reply belongs (a proxy's
    /// login or error page).
    pub(super) html: bool,
    /// `x-mock-close-delimited: 1`: a stream without chunks or length, ended by closing the
    /// connection (an HTTP/1.0-style server).
    pub(super) close_delimited: bool,
    /// `x-mock-body-delay-ms: N`: a reply with a whole body (an error, say) goes chunked: its
    /// header and first byte, then the rest N ms later, as from an upstream that stalls
    /// mid-reply.
    pub(super) body_delay_ms: u64,
    /// `x-mock-provider-headers`: the reply carries what a hosted provider says about itself
    /// (`server`, `via`, cookies, org and project ids, its own request id, `alt-svc`, CORS
    /// and rate-limit headers), as OpenAI's and Anthropic's replies do.
    pub(super) provider_headers: bool,
    /// `x-mock-echo-request-id`: the reply's `x-request-id` is the one the request carried,
    /// as some OpenAI-compatible servers answer.
    pub(super) echoed_request_id: Option<HeaderValue>,
    /// `x-mock-gzip: 1`: a success goes gzip-compressed (`Content-Encoding: gzip`), whatever
    /// the request's `Accept-Encoding` said, as from a server that ignores it.
    pub(super) gzip: bool,
    /// `x-mock-pad-bytes: N`: a plain success is padded (a `padding` field) to about N bytes,
    /// its `usage` still last.
    pub(super) pad_bytes: Option<usize>,
    /// `x-mock-plain-reply: 1`: a chat request that asks for a stream gets a plain JSON reply
    /// (with its `usage`), as from an upstream that ignores `stream`.
    pub(super) plain_reply: bool,
    /// `x-mock-ignore-max-tokens: 1`: the reply runs to its `chunks` whatever output limit the
    /// request sets (a provider that ignores the limit). Otherwise a limit below `chunks`
    /// shortens the reply to it, which then ends as length-limited, as a provider's does.
    pub(super) ignore_max_tokens: bool,
    /// The reply was shortened to the request's output limit.
    pub(super) length_limited: bool,
    /// `x-mock-tool-calls: N` (at most 16): a Messages turn that calls tools calls N.
    pub(super) tool_calls: Option<usize>,
    /// `x-mock-cache-write: 1`: a Messages prompt's cached part is reported as written to
    /// the cache, not read from it.
    pub(super) cache_write: bool,
}

impl Overrides {
    /// A chat or completions reply's finish reason.
    pub(super) fn finish(&self) -> &'static str {
        if self.length_limited {
            "length"
        } else {
            "stop"
        }
    }

    pub(super) fn from_headers(headers: &HeaderMap, opts: &MockOptions) -> Self {
        let tool_calls = header_parse::<usize>(headers, "x-mock-tool-calls").map(|n| n.min(16));
        let cache_write = header_flag(headers, "x-mock-cache-write");
        Overrides {
            chunks: header_parse::<usize>(headers, "x-mock-chunks")
                .unwrap_or(opts.chunks)
                .min(MAX_CHUNKS),
            delay_ms: header_parse::<u64>(headers, "x-mock-delay-ms")
                .unwrap_or(opts.delay_ms)
                .min(MAX_DELAY_MS),
            split: header_parse::<usize>(headers, "x-mock-split").filter(|k| *k > 0),
            status: header_parse::<u16>(headers, "x-mock-status")
                .filter(|s| (400..=599).contains(s)),
            ignore_include_usage: header_flag(headers, "x-mock-ignore-include-usage"),
            garbage: header_flag(headers, "x-mock-garbage"),
            cut_after: header_parse::<usize>(headers, "x-mock-cut-after"),
            empty_body: header_flag(headers, "x-mock-empty-body"),
            text_body: header_flag(headers, "x-mock-text-body"),
            retry_after: header_parse::<u64>(headers, "x-mock-retry-after"),
            usage_shape: super::stream::UsageShape::parse(
                std::str::from_utf8(header_bytes(headers, "x-mock-usage-shape")).unwrap_or(""),
            ),
            usage: serde_json::from_slice(header_bytes(headers, "x-mock-usage")).ok(),
            informational: header_parse::<u16>(headers, "x-mock-informational")
                .filter(|s| (100..=199).contains(s)),
            html: header_flag(headers, "x-mock-html"),
            close_delimited: header_flag(headers, "x-mock-close-delimited"),
            body_delay_ms: header_parse::<u64>(headers, "x-mock-body-delay-ms")
                .unwrap_or(0)
                .min(MAX_DELAY_MS),
            provider_headers: header_flag(headers, "x-mock-provider-headers"),
            plain_reply: header_flag(headers, "x-mock-plain-reply"),
            ignore_max_tokens: header_flag(headers, "x-mock-ignore-max-tokens"),
            length_limited: false,
            echoed_request_id: header_flag(headers, "x-mock-echo-request-id")
                .then(|| headers.get("x-request-id").cloned())
                .flatten(),
            gzip: header_flag(headers, "x-mock-gzip"),
            pad_bytes: header_parse::<usize>(headers, "x-mock-pad-bytes")
                .map(|n| n.min(MAX_PAD_BYTES)),
            tool_calls,
            cache_write,
        }
    }
}

pub(super) fn header_bytes<'a>(headers: &'a HeaderMap, name: &str) -> &'a [u8] {
    headers.get(name).map_or(&b""[..], |v| v.as_bytes())
}

pub(super) fn header_parse<T: FromStr>(headers: &HeaderMap, name: &str) -> Option<T> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

fn header_flag(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
        .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "yes" | "on"))
}

/// The request body as received (after transfer decoding).
pub(super) struct RequestBody {
    /// The body, empty when `too_large`.
    pub(super) data: Bytes,
    pub(super) total_len: usize,
    pub(super) sha256_hex: String,
    pub(super) too_large: bool,
}

pub(super) async fn read_body(session: &mut ServerSession) -> pingora_error::Result<RequestBody> {
    let mut data = BytesMut::new();
    let mut hasher = Sha256::new();
    let mut total_len = 0usize;
    let mut too_large = false;
    while let Some(chunk) = session.read_request_body().await? {
        hasher.update(&chunk);
        total_len = total_len.saturating_add(chunk.len());
        if total_len > MAX_BODY_BYTES {
            too_large = true;
            data = BytesMut::new();
        } else {
            data.extend_from_slice(&chunk);
        }
    }
    Ok(RequestBody {
        data: data.freeze(),
        total_len,
        sha256_hex: hex::encode(hasher.finalize()),
        too_large,
    })
}

/// One part of a multipart/form-data body.
#[derive(Debug)]
struct FormPart {
    name: String,
    file_name: Option<String>,
    data: Bytes,
}

#[derive(Debug, Default)]
pub(super) struct FormData {
    parts: Vec<FormPart>,
}

impl FormData {
    /// The first non-file field called `name`, as (lossy) text.
    pub(super) fn field(&self, name: &str) -> Option<String> {
        self.parts
            .iter()
            .find(|p| p.name == name && p.file_name.is_none())
            .map(|p| String::from_utf8_lossy(&p.data).into_owned())
    }

    /// Size of the first part called `name` (file or not).
    pub(super) fn part_len(&self, name: &str) -> Option<usize> {
        self.parts
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.data.len())
    }
}

/// The request body, decoded according to its content type.
#[derive(Debug)]
pub(super) enum Parsed {
    Empty,
    Json(Value),
    Form(FormData),
    Invalid(String),
}

impl Parsed {
    /// The body asks for a stream (`"stream": true`).
    pub(super) fn stream(&self) -> bool {
        matches!(self, Parsed::Json(v) if v.get("stream").and_then(Value::as_bool) == Some(true))
    }

    /// The output limit the body sets (`max_tokens`, `max_completion_tokens` or
    /// `max_output_tokens`: the least of those set).
    pub(super) fn output_limit(&self) -> Option<usize> {
        let Parsed::Json(v) = self else { return None };
        ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .filter_map(|k| v.get(*k).and_then(Value::as_u64))
            .min()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// The `model` value as received, empty when there is none.
    pub(super) fn model(&self) -> String {
        match self {
            Parsed::Json(v) => match v.get("model") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            },
            Parsed::Form(form) => form.field("model").unwrap_or_default(),
            Parsed::Empty | Parsed::Invalid(_) => String::new(),
        }
    }
}

fn is_multipart(content_type: &str) -> bool {
    content_type
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
}

pub(super) async fn parse_body(content_type: &str, body: Bytes) -> Parsed {
    if is_multipart(content_type) {
        return match parse_multipart(content_type, body).await {
            Ok(form) => Parsed::Form(form),
            Err(e) => Parsed::Invalid(format!("invalid multipart body: {e}")),
        };
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Parsed::Empty;
    }
    match serde_json::from_slice::<Value>(&body) {
        Ok(v) => Parsed::Json(v),
        Err(e) => Parsed::Invalid(format!("invalid JSON body: {e}")),
    }
}

async fn parse_multipart(content_type: &str, body: Bytes) -> Result<FormData, multer::Error> {
    let boundary = multer::parse_boundary(content_type)?;
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut form = FormData::default();
    while let Some(field) = multipart.next_field().await? {
        let name = field.name().unwrap_or_default().to_string();
        let file_name = field.file_name().map(str::to_string);
        let data = field.bytes().await?;
        form.parts.push(FormPart {
            name,
            file_name,
            data,
        });
    }
    Ok(form)
}

/// What the echo headers report about the request.
pub(super) struct Echo {
    pub(super) model: String,
    pub(super) authorization: Vec<u8>,
    /// `x-api-key` and `anthropic-version` as they arrived (Messages API).
    pub(super) x_api_key: Vec<u8>,
    pub(super) anthropic_version: Vec<u8>,
    /// W3C trace context as it arrived.
    pub(super) traceparent: Vec<u8>,
    pub(super) tracestate: Vec<u8>,
    /// The codings the request accepts, as it arrived.
    pub(super) accept_encoding: Vec<u8>,
    pub(super) body_len: usize,
    pub(super) body_sha256: String,
    pub(super) path: String,
    /// `x-mock-echo-body: 1`: the JSON body as it arrived, base64 (at most 24 KiB of it), in
    /// `x-mock-body`, for tests that check what a translated request became.
    pub(super) body: Option<String>,
    /// The connection's source address ("" when unknown): which connection a request came on.
    pub(super) peer: String,
}

impl Echo {
    /// The request headers a reply echoes, as they arrived; the rest left blank.
    pub(super) fn of_headers(h: &http::HeaderMap) -> Echo {
        let copy = |name: &str| super::header_bytes(h, name).to_vec();
        Echo {
            model: String::new(),
            authorization: copy("authorization"),
            x_api_key: copy("x-api-key"),
            anthropic_version: copy("anthropic-version"),
            traceparent: copy("traceparent"),
            tracestate: copy("tracestate"),
            accept_encoding: copy("accept-encoding"),
            body_len: 0,
            body_sha256: String::new(),
            body: None,
            path: String::new(),
            peer: String::new(),
        }
    }
}

/// A header value from arbitrary bytes: invalid bytes (controls) are dropped.
fn header_value(bytes: &[u8]) -> HeaderValue {
    if let Ok(v) = HeaderValue::from_bytes(bytes) {
        return v;
    }
    let cleaned: Vec<u8> = bytes
        .iter()
        .copied()
        .filter(|b| *b == b'\t' || (*b >= 0x20 && *b != 0x7f))
        .collect();
    HeaderValue::from_bytes(cleaned.trim_ascii()).unwrap_or(HeaderValue::from_static(""))
}

/// What a hosted provider's reply says about the provider (`x-mock-provider-headers`), from
/// OpenAI's and Anthropic's replies as their APIs document and send them; the request id
/// counts up so that each reply's is its own.
pub(super) fn add_provider_headers(header: &mut ResponseHeader) -> pingora_error::Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    header.insert_header("x-request-id", format!("req_mock{n:012}"))?;
    header.append_header("request-id", format!("req_mock_anthropic{n:012}"))?;
    for (name, value) in PROVIDER_HEADERS {
        header.append_header(*name, *value)?;
    }
    Ok(())
}

/// The provider's self-description a mock reply carries besides its request id.
pub(super) const PROVIDER_HEADERS: &[(&str, &str)] = &[
    ("openai-organization", "org-mock"),
    ("openai-project", "proj_mock"),
    ("openai-processing-ms", "7"),
    ("openai-version", "2020-10-01"),
    ("anthropic-organization-id", "mock-org-id"),
    ("set-cookie", "__cf_bm=mock; path=/; HttpOnly; Secure"),
    ("set-cookie", "modelgate_session=from-upstream; Path=/"),
    ("server", "mock-upstream"),
    ("via", "1.1 mock-edge"),
    ("alt-svc", "h3=\":443\"; ma=86400"),
    ("cf-ray", "mock-ray"),
    ("access-control-allow-origin", "*"),
    ("access-control-allow-credentials", "true"),
    ("x-ratelimit-limit-requests", "10000"),
    ("anthropic-ratelimit-requests-limit", "4000"),
    ("strict-transport-security", "max-age=31536000"),
];

pub(super) fn add_echo_headers(
    header: &mut ResponseHeader,
    echo: &Echo,
) -> pingora_error::Result<()> {
    header.insert_header("x-mock-model", header_value(echo.model.as_bytes()))?;
    header.insert_header("x-mock-authorization", header_value(&echo.authorization))?;
    header.insert_header("x-mock-x-api-key", header_value(&echo.x_api_key))?;
    header.insert_header(
        "x-mock-anthropic-version",
        header_value(&echo.anthropic_version),
    )?;
    header.insert_header("x-mock-traceparent", header_value(&echo.traceparent))?;
    header.insert_header("x-mock-tracestate", header_value(&echo.tracestate))?;
    header.insert_header(
        "x-mock-accept-encoding",
        header_value(&echo.accept_encoding),
    )?;
    header.insert_header("x-mock-body-len", echo.body_len.to_string())?;
    header.insert_header("x-mock-body-sha256", echo.body_sha256.as_str())?;
    if let Some(b) = &echo.body {
        header.insert_header("x-mock-body", b.as_str())?;
    }
    header.insert_header("x-mock-path", header_value(echo.path.as_bytes()))?;
    header.insert_header("x-mock-peer", header_value(echo.peer.as_bytes()))?;
    Ok(())
}

/// `x-mock-echo-body: 1`: a JSON body as it arrived, base64, when at most 24 KiB.
pub(super) fn echo_body(headers: &HeaderMap, parsed: &Parsed) -> Option<String> {
    use base64::Engine;
    let Parsed::Json(v) = parsed else { return None };
    if !header_flag(headers, "x-mock-echo-body") {
        return None;
    }
    let text = v.to_string();
    (text.len() <= 24 * 1024).then(|| base64::engine::general_purpose::STANDARD.encode(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_are_read_from_headers_and_bounded() {
        let mut headers = HeaderMap::new();
        headers.insert("x-mock-chunks", HeaderValue::from_static("3"));
        headers.insert("x-mock-split", HeaderValue::from_static("0"));
        headers.insert("x-mock-status", HeaderValue::from_static("42"));
        headers.insert("x-mock-garbage", HeaderValue::from_static("1"));
        let ov = Overrides::from_headers(&headers, &MockOptions::default());
        assert_eq!(ov.chunks, 3);
        assert_eq!(ov.split, None);
        assert_eq!(ov.status, None);
        assert!(ov.garbage);
        assert!(!ov.ignore_include_usage);
    }

    #[test]
    fn echo_header_values_drop_control_bytes() {
        assert_eq!(header_value(b"a\x01b").as_bytes(), b"ab");
    }
}
