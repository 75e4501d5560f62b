//! Deterministic OpenAI-compatible stand-in model server (model `echo-1`) used by the demo,
//! the integration tests and the benches. Every reply is a pure function of the request, echo
//! headers (`x-mock-*`) expose what arrived, and `x-mock-*` request headers force edge cases.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method};
use pingora_core::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::listening::Service;
use pingora_http::ResponseHeader;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The words the mock "model" says, in order, cycling. Non-ASCII on purpose so that tests
/// exercise UTF-8 characters split across reads.
pub const REPLY_WORDS: [&str; 10] = [
    "Hello",
    "from",
    "the",
    "mock",
    "café",
    "naïve",
    "✓",
    "日本語",
    "model",
    "upstream",
];

/// The only model the mock lists.
const MOCK_MODEL_ID: &str = "echo-1";
/// Largest request body buffered in memory; bigger bodies are drained and refused with 413.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Upper bound for `chunks` (option or `x-mock-chunks`), to keep replies bounded.
const MAX_CHUNKS: usize = 100_000;
/// Upper bound for `delay_ms` (option or `x-mock-delay-ms`).
const MAX_DELAY_MS: u64 = 60_000;
/// Upper bound for the number of generated images.
const MAX_IMAGES: usize = 16;
/// Pause between the pieces of a split (`x-mock-split`) stream.
const SPLIT_PAUSE: Duration = Duration::from_millis(2);
/// Length of the `/v1/audio/speech` reply body.
const SPEECH_LEN: usize = 4096;
/// The "image" every image endpoint returns (base64-encoded in `b64_json`).
const MOCK_IMAGE: &[u8] = b"\x89PNG\r\n\x1a\nmodelgate-mock-image";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Options of the mock server.
#[derive(Clone, Debug)]
pub struct MockOptions {
    /// Number of completion "tokens" per reply (and stream chunks carrying text).
    pub chunks: usize,
    /// Pause between streamed events, in milliseconds.
    pub delay_ms: u64,
    /// Serve HTTPS with this (certificate PEM path, private key PEM path).
    pub tls: Option<(String, String)>,
}

impl Default for MockOptions {
    fn default() -> Self {
        MockOptions {
            chunks: 8,
            delay_ms: 0,
            tls: None,
        }
    }
}

/// The mock model server, a Pingora HTTP application.
pub struct MockUpstream {
    opts: MockOptions,
}

impl MockUpstream {
    pub fn new(opts: MockOptions) -> Self {
        MockUpstream { opts }
    }
}

/// A listening service for `server.add_service(...)`.
pub fn service(listen: &str, opts: MockOptions) -> pingora_error::Result<Service<MockUpstream>> {
    let tls = opts.tls.clone();
    let mut svc = Service::new("mock upstream".to_string(), MockUpstream::new(opts));
    match tls {
        Some((cert, key)) => svc.add_tls(listen, &cert, &key)?,
        None => svc.add_tcp(listen),
    }
    Ok(svc)
}

/// Runs a standalone Pingora server with only the mock (for
/// `modelgate mock-upstream --listen ADDR`). Blocks forever.
///
/// Unlike Pingora's defaults (5 minute grace period), SIGTERM stops the mock within ~1 s.
pub fn run_standalone(listen: &str, opts: MockOptions) -> ! {
    let conf = ServerConf {
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    match service(listen, opts) {
        Ok(svc) => {
            server.add_service(svc);
        }
        Err(e) => {
            log::error!("mock upstream: cannot listen on {listen}: {e}");
            std::process::exit(2);
        }
    }
    log::info!("mock upstream listening on {listen}");
    server.run_forever()
}

#[async_trait]
impl HttpServerApp for MockUpstream {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        match session.read_request().await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                log::debug!("mock upstream: cannot read request: {e}");
                return None;
            }
        }
        let http10_close = {
            let req = session.req_header();
            req.version == http::Version::HTTP_10
                && !header_bytes(&req.headers, "connection").eq_ignore_ascii_case(b"keep-alive")
        };
        if *shutdown.borrow() || http10_close {
            session.set_keepalive(None);
        } else {
            session.set_keepalive(Some(60));
        }

        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        let overrides = Overrides::from_headers(&req.headers, &self.opts);
        let authorization = header_bytes(&req.headers, "authorization").to_vec();
        let content_type =
            String::from_utf8_lossy(header_bytes(&req.headers, "content-type")).into_owned();
        let expect_continue =
            header_bytes(&req.headers, "expect").eq_ignore_ascii_case(b"100-continue");

        if expect_continue {
            if let Err(e) = session.write_continue_response().await {
                log::debug!("mock upstream: cannot write 100-continue: {e}");
                return None;
            }
        }

        let body = match read_body(&mut session).await {
            Ok(body) => body,
            Err(e) => {
                log::debug!("mock upstream: cannot read request body: {e}");
                return None;
            }
        };

        let parsed = if body.too_large {
            Parsed::Empty
        } else {
            parse_body(&content_type, body.data.clone()).await
        };
        let echo = Echo {
            model: parsed.model(),
            authorization,
            body_len: body.total_len,
            body_sha256: body.sha256_hex,
            path: path.clone(),
        };

        if overrides.garbage {
            write_garbage(&mut session, &echo).await;
            return None;
        }

        let reply = if let Some(status) = overrides.status {
            forced_error(status)
        } else if body.too_large {
            error_reply(
                413,
                "invalid_request_error",
                &format!("request body larger than {MAX_BODY_BYTES} bytes"),
                "body_too_large",
            )
        } else {
            route(&method, &path, &parsed, &overrides, &echo.model)
        };

        // A non-streamed reply waits `delay_ms` before its header (a slow model); a stream
        // waits between its events instead.
        if delays_header(&reply) && overrides.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(overrides.delay_ms)).await;
        }
        if let Err(e) = write_reply(&mut session, reply, &echo, &overrides).await {
            log::debug!("mock upstream: cannot write the reply: {e}");
            return None;
        }

        let settings = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
            Ok(Some(stream)) => Some(ReusedHttpStream::from_reusable_stream(stream, settings)),
            Ok(None) => None,
            Err(e) => {
                log::debug!("mock upstream: cannot finish the session: {e}");
                None
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Request side
// ---------------------------------------------------------------------------------------------

/// Per-request settings: the server options overridden by `x-mock-*` request headers.
#[derive(Clone, Debug, PartialEq)]
struct Overrides {
    chunks: usize,
    delay_ms: u64,
    split: Option<usize>,
    status: Option<u16>,
    ignore_include_usage: bool,
    garbage: bool,
    /// `x-mock-cut-after: N`: a stream stops after N events and the connection drops.
    cut_after: Option<usize>,
}

impl Overrides {
    fn from_headers(headers: &HeaderMap, opts: &MockOptions) -> Self {
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
        }
    }
}

fn header_bytes<'a>(headers: &'a HeaderMap, name: &str) -> &'a [u8] {
    headers.get(name).map_or(&b""[..], |v| v.as_bytes())
}

fn header_parse<T: FromStr>(headers: &HeaderMap, name: &str) -> Option<T> {
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
struct RequestBody {
    /// The body, empty when `too_large`.
    data: Bytes,
    total_len: usize,
    sha256_hex: String,
    too_large: bool,
}

async fn read_body(session: &mut ServerSession) -> pingora_error::Result<RequestBody> {
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
struct FormData {
    parts: Vec<FormPart>,
}

impl FormData {
    /// The first non-file field called `name`, as (lossy) text.
    fn field(&self, name: &str) -> Option<String> {
        self.parts
            .iter()
            .find(|p| p.name == name && p.file_name.is_none())
            .map(|p| String::from_utf8_lossy(&p.data).into_owned())
    }

    /// Size of the first part called `name` (file or not).
    fn part_len(&self, name: &str) -> Option<usize> {
        self.parts
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.data.len())
    }
}

/// The request body, decoded according to its content type.
#[derive(Debug)]
enum Parsed {
    Empty,
    Json(Value),
    Form(FormData),
    Invalid(String),
}

impl Parsed {
    /// The `model` value as received, empty when there is none.
    fn model(&self) -> String {
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

async fn parse_body(content_type: &str, body: Bytes) -> Parsed {
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
struct Echo {
    model: String,
    authorization: Vec<u8>,
    body_len: usize,
    body_sha256: String,
    path: String,
}

// ---------------------------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------------------------

fn delays_header(reply: &Reply) -> bool {
    !matches!(reply.body, ReplyBody::Events(_))
}

#[derive(Debug)]
enum ReplyBody {
    /// A complete body sent with Content-Length.
    Full(Bytes),
    /// Server-sent events sent with chunked transfer encoding.
    Events(Vec<Bytes>),
}

#[derive(Debug)]
struct Reply {
    status: u16,
    content_type: &'static str,
    body: ReplyBody,
}

impl Reply {
    fn json(status: u16, value: &Value) -> Self {
        Reply {
            status,
            content_type: "application/json",
            body: ReplyBody::Full(Bytes::from(value.to_string())),
        }
    }

    fn text(status: u16, text: String) -> Self {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: ReplyBody::Full(Bytes::from(text)),
        }
    }

    fn events(events: Vec<Bytes>) -> Self {
        Reply {
            status: 200,
            content_type: "text/event-stream",
            body: ReplyBody::Events(events),
        }
    }
}

fn error_body(message: &str, error_type: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": error_type, "param": null, "code": code}})
}

fn error_reply(status: u16, error_type: &str, message: &str, code: &str) -> Reply {
    Reply::json(status, &error_body(message, error_type, code))
}

fn bad_request(message: &str) -> Reply {
    error_reply(400, "invalid_request_error", message, "invalid_request")
}

fn not_found() -> Reply {
    error_reply(
        404,
        "invalid_request_error",
        "unknown endpoint on the mock upstream",
        "not_found",
    )
}

/// The reply for `x-mock-status: S`.
fn forced_error(status: u16) -> Reply {
    let error_type = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    error_reply(
        status,
        error_type,
        &format!("mock upstream forced status {status}"),
        "mock_error",
    )
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn next_id(prefix: &str) -> String {
    format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// Number of whitespace-separated words.
fn count_words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The completion tokens: word `i` of [`REPLY_WORDS`] (cycling), each followed by a space
/// except the last.
fn reply_tokens(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let word = REPLY_WORDS[i % REPLY_WORDS.len()];
            if i + 1 < n {
                format!("{word} ")
            } else {
                word.to_string()
            }
        })
        .collect()
}

/// The full reply text for `n` tokens, as the mock sends it.
pub fn reply_text(n: usize) -> String {
    reply_tokens(n).concat()
}

/// Words in a chat message `content` (a string, or an array of parts whose text parts count).
fn content_words(content: &Value) -> usize {
    match content {
        Value::String(s) => count_words(s),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part {
                Value::String(s) => count_words(s),
                Value::Object(obj) => {
                    let is_text = obj
                        .get("type")
                        .and_then(Value::as_str)
                        .is_none_or(|t| t == "text");
                    if is_text {
                        obj.get("text")
                            .and_then(Value::as_str)
                            .map_or(0, count_words)
                    } else {
                        0
                    }
                }
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

/// `prompt_tokens` of a chat request: words in all message contents, at least 1.
fn chat_prompt_tokens(body: &Map<String, Value>) -> usize {
    body.get("messages")
        .and_then(Value::as_array)
        .map_or(0, |messages| {
            messages
                .iter()
                .map(|m| m.get("content").map_or(0, content_words))
                .sum()
        })
        .max(1)
}

/// `prompt_tokens` of a legacy completion request (`prompt` string, strings, or token arrays).
fn completion_prompt_tokens(body: &Map<String, Value>) -> usize {
    fn prompt_words(v: &Value) -> usize {
        match v {
            Value::String(s) => count_words(s),
            Value::Number(_) => 1,
            Value::Array(items) => items.iter().map(prompt_words).sum(),
            _ => 0,
        }
    }
    body.get("prompt").map_or(0, prompt_words).max(1)
}

fn usage_json(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// One server-sent event: `data: <json>\n\n`.
fn sse_event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

fn sse_done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// Cuts the concatenated event stream into pieces of `k` bytes (the last may be shorter).
/// The flag tells whether the piece ends at or crosses the end of an event.
fn split_pieces(events: &[Bytes], k: usize) -> Vec<(Bytes, bool)> {
    let k = k.max(1);
    let mut all = BytesMut::new();
    let mut ends = Vec::with_capacity(events.len());
    for event in events {
        all.extend_from_slice(event);
        ends.push(all.len());
    }
    let all = all.freeze();
    let mut pieces = Vec::with_capacity(all.len() / k + 1);
    let mut start = 0;
    while start < all.len() {
        let end = start.saturating_add(k).min(all.len());
        let boundary = ends.iter().any(|e| *e > start && *e <= end);
        pieces.push((all.slice(start..end), boundary));
        start = end;
    }
    pieces
}

/// Inserts or replaces `key` in a JSON object (no-op for other values).
fn set_field(target: &mut Value, key: &str, value: Value) {
    if let Some(obj) = target.as_object_mut() {
        obj.insert(key.to_string(), value);
    }
}

/// Everything a streamed reply needs to know.
struct StreamSpec<'a> {
    id: &'a str,
    created: u64,
    model: &'a str,
    prompt_tokens: usize,
    tokens: &'a [String],
    include_usage: bool,
}

fn chat_chunk(spec: &StreamSpec<'_>, delta: Value, finish_reason: Value) -> Value {
    let mut chunk = json!({
        "id": spec.id,
        "object": "chat.completion.chunk",
        "created": spec.created,
        "model": spec.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
    });
    if spec.include_usage {
        set_field(&mut chunk, "usage", Value::Null);
    }
    chunk
}

/// The SSE events of a streamed chat completion, `[DONE]` included.
fn chat_stream_events(spec: &StreamSpec<'_>) -> Vec<Bytes> {
    let mut events = Vec::with_capacity(spec.tokens.len() + 4);
    events.push(sse_event(&chat_chunk(
        spec,
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )));
    for token in spec.tokens {
        events.push(sse_event(&chat_chunk(
            spec,
            json!({"content": token}),
            Value::Null,
        )));
    }
    events.push(sse_event(&chat_chunk(spec, json!({}), json!("stop"))));
    if spec.include_usage {
        events.push(sse_event(&json!({
            "id": spec.id,
            "object": "chat.completion.chunk",
            "created": spec.created,
            "model": spec.model,
            "choices": [],
            "usage": usage_json(spec.prompt_tokens, spec.tokens.len()),
        })));
    }
    events.push(sse_done());
    events
}

fn completion_chunk(spec: &StreamSpec<'_>, text: &str, finish_reason: Value) -> Value {
    let mut chunk = json!({
        "id": spec.id,
        "object": "text_completion",
        "created": spec.created,
        "model": spec.model,
        "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}],
    });
    if spec.include_usage {
        set_field(&mut chunk, "usage", Value::Null);
    }
    chunk
}

/// The SSE events of a streamed legacy completion, `[DONE]` included.
fn completion_stream_events(spec: &StreamSpec<'_>) -> Vec<Bytes> {
    let mut events = Vec::with_capacity(spec.tokens.len() + 3);
    for token in spec.tokens {
        events.push(sse_event(&completion_chunk(spec, token, Value::Null)));
    }
    events.push(sse_event(&completion_chunk(spec, "", json!("stop"))));
    if spec.include_usage {
        events.push(sse_event(&json!({
            "id": spec.id,
            "object": "text_completion",
            "created": spec.created,
            "model": spec.model,
            "choices": [],
            "usage": usage_json(spec.prompt_tokens, spec.tokens.len()),
        })));
    }
    events.push(sse_done());
    events
}

/// The 8-float embedding of `input`: the first 8 bytes of its SHA-256, divided by 255.
fn embedding_vector(input: &[u8]) -> [f32; 8] {
    let digest = Sha256::digest(input);
    let mut out = [0f32; 8];
    for (slot, byte) in out.iter_mut().zip(digest.iter()) {
        *slot = f32::from(*byte) / 255.0;
    }
    out
}

/// Base64 of the little-endian f32 bytes, as OpenAI's `encoding_format: "base64"`.
fn embedding_base64(vector: &[f32]) -> String {
    let mut bytes = Vec::with_capacity(vector.len() * 4);
    for f in vector {
        bytes.extend_from_slice(&f.to_le_bytes());
    }
    BASE64.encode(bytes)
}

/// One embeddings input: text, or an array of token ids.
#[derive(Debug, PartialEq)]
enum EmbeddingInput {
    Text(String),
    Tokens(Vec<i64>),
}

impl EmbeddingInput {
    fn words(&self) -> usize {
        match self {
            EmbeddingInput::Text(s) => count_words(s),
            EmbeddingInput::Tokens(t) => t.len(),
        }
    }

    fn key_bytes(&self) -> Vec<u8> {
        match self {
            EmbeddingInput::Text(s) => s.as_bytes().to_vec(),
            EmbeddingInput::Tokens(t) => t.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

fn token_array(items: &[Value]) -> Option<Vec<i64>> {
    items.iter().map(Value::as_i64).collect()
}

/// `input` of an embeddings request: a string, strings, a token array or token arrays.
fn embedding_inputs(input: &Value) -> Option<Vec<EmbeddingInput>> {
    match input {
        Value::String(s) => Some(vec![EmbeddingInput::Text(s.clone())]),
        Value::Array(items) if items.is_empty() => None,
        Value::Array(items) if items.iter().all(Value::is_number) => {
            token_array(items).map(|t| vec![EmbeddingInput::Tokens(t)])
        }
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Some(EmbeddingInput::Text(s.clone())),
                Value::Array(tokens) => token_array(tokens).map(EmbeddingInput::Tokens),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// The `/v1/audio/speech` body: `ID3` then the SHA-256 of the input, repeated to 4096 bytes.
fn speech_bytes(input: &str) -> Vec<u8> {
    let digest = Sha256::digest(input.as_bytes());
    let mut out = Vec::with_capacity(SPEECH_LEN);
    out.extend_from_slice(b"ID3");
    while out.len() < SPEECH_LEN {
        let need = (SPEECH_LEN - out.len()).min(digest.len());
        out.extend_from_slice(&digest[..need]);
    }
    out
}

/// The JSON object of a request, or the 400 reply explaining why there is none.
fn json_object(parsed: &Parsed) -> Result<&Map<String, Value>, Reply> {
    match parsed {
        Parsed::Json(Value::Object(obj)) => Ok(obj),
        Parsed::Json(_) => Err(bad_request("request body must be a JSON object")),
        Parsed::Empty => Err(bad_request("missing JSON request body")),
        Parsed::Form(_) => Err(bad_request("expected a JSON body, got multipart/form-data")),
        Parsed::Invalid(msg) => Err(bad_request(msg)),
    }
}

fn model_or_default(model: &str) -> &str {
    if model.is_empty() {
        MOCK_MODEL_ID
    } else {
        model
    }
}

/// Answers a (fully read) request. `model` is the received model value.
fn route(method: &Method, path: &str, parsed: &Parsed, ov: &Overrides, model: &str) -> Reply {
    let get = method == Method::GET || method == Method::HEAD;
    let post = method == Method::POST;
    let result = match path {
        "/v1/models" if get => Ok(models_reply()),
        "/health" | "/healthz" if get => Ok(Reply::text(200, "ok".to_string())),
        "/v1/chat/completions" if post => chat_completions(parsed, ov, model),
        "/v1/completions" if post => completions(parsed, ov, model),
        "/v1/embeddings" if post => embeddings(parsed, model),
        "/v1/moderations" if post => moderations(parsed, model),
        "/v1/images/generations" if post => json_object(parsed).map(|_| images(parsed)),
        "/v1/images/edits" | "/v1/images/variations" if post => match parsed {
            Parsed::Form(_) | Parsed::Json(Value::Object(_)) => Ok(images(parsed)),
            other => Err(json_object(other)
                .err()
                .unwrap_or_else(|| bad_request("expected a multipart/form-data body"))),
        },
        "/v1/audio/transcriptions" | "/v1/audio/translations" if post => transcription(parsed),
        "/v1/audio/speech" if post => speech(parsed),
        _ => Ok(not_found()),
    };
    result.unwrap_or_else(|err| err)
}

fn models_reply() -> Reply {
    Reply::json(
        200,
        &json!({
            "object": "list",
            "data": [{"id": MOCK_MODEL_ID, "object": "model", "created": 1_700_000_000u64, "owned_by": "mock"}],
        }),
    )
}

fn stream_flags(body: &Map<String, Value>, ov: &Overrides) -> (bool, bool) {
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true)
        && !ov.ignore_include_usage;
    (stream, include_usage)
}

fn chat_completions(parsed: &Parsed, ov: &Overrides, model: &str) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    let prompt_tokens = chat_prompt_tokens(body);
    let tokens = reply_tokens(ov.chunks);
    let (stream, include_usage) = stream_flags(body, ov);
    let id = next_id("chatcmpl-mock");
    let created = now_secs();
    let model = model_or_default(model);
    if stream {
        let spec = StreamSpec {
            id: &id,
            created,
            model,
            prompt_tokens,
            tokens: &tokens,
            include_usage,
        };
        return Ok(Reply::events(chat_stream_events(&spec)));
    }
    Ok(Reply::json(
        200,
        &json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": tokens.concat()},
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": usage_json(prompt_tokens, tokens.len()),
        }),
    ))
}

fn completions(parsed: &Parsed, ov: &Overrides, model: &str) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    let prompt_tokens = completion_prompt_tokens(body);
    let tokens = reply_tokens(ov.chunks);
    let (stream, include_usage) = stream_flags(body, ov);
    let id = next_id("cmpl-mock");
    let created = now_secs();
    let model = model_or_default(model);
    if stream {
        let spec = StreamSpec {
            id: &id,
            created,
            model,
            prompt_tokens,
            tokens: &tokens,
            include_usage,
        };
        return Ok(Reply::events(completion_stream_events(&spec)));
    }
    Ok(Reply::json(
        200,
        &json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": tokens.concat(), "logprobs": null, "finish_reason": "stop"}],
            "usage": usage_json(prompt_tokens, tokens.len()),
        }),
    ))
}

fn embeddings(parsed: &Parsed, model: &str) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    let inputs = body
        .get("input")
        .and_then(embedding_inputs)
        .ok_or_else(|| {
            bad_request("`input` must be a string, an array of strings or an array of token arrays")
        })?;
    let base64 = body.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let words: usize = inputs.iter().map(EmbeddingInput::words).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let vector = embedding_vector(&input.key_bytes());
            let embedding = if base64 {
                json!(embedding_base64(&vector))
            } else {
                json!(vector.to_vec())
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Reply::json(
        200,
        &json!({
            "object": "list",
            "data": data,
            "model": model_or_default(model),
            "usage": {"prompt_tokens": words, "total_tokens": words},
        }),
    ))
}

fn moderations(parsed: &Parsed, model: &str) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    let count = match body.get("input") {
        Some(Value::Array(items)) => items.len(),
        Some(Value::Null) | None => return Err(bad_request("missing `input`")),
        Some(_) => 1,
    };
    let model = if model.is_empty() {
        "omni-moderation-latest"
    } else {
        model
    };
    let results: Vec<Value> = (0..count)
        .map(|_| json!({"flagged": false, "categories": {}, "category_scores": {}}))
        .collect();
    Ok(Reply::json(
        200,
        &json!({"id": "modr-mock", "model": model, "results": results}),
    ))
}

/// `prompt` and `n` of an image request (JSON or multipart).
fn image_params(parsed: &Parsed) -> (Option<String>, usize) {
    let (prompt, n) = match parsed {
        Parsed::Json(v) => (
            v.get("prompt").and_then(Value::as_str).map(str::to_string),
            v.get("n")
                .and_then(|n| n.as_u64().or_else(|| n.as_str()?.trim().parse().ok())),
        ),
        Parsed::Form(form) => (
            form.field("prompt"),
            form.field("n").and_then(|n| n.trim().parse::<u64>().ok()),
        ),
        Parsed::Empty | Parsed::Invalid(_) => (None, None),
    };
    let n = n
        .map_or(1, |n| usize::try_from(n).unwrap_or(MAX_IMAGES))
        .clamp(1, MAX_IMAGES);
    (prompt, n)
}

fn images(parsed: &Parsed) -> Reply {
    let (prompt, n) = image_params(parsed);
    let b64 = BASE64.encode(MOCK_IMAGE);
    let data: Vec<Value> = (0..n)
        .map(|_| json!({"b64_json": b64, "revised_prompt": prompt}))
        .collect();
    Reply::json(200, &json!({"created": now_secs(), "data": data}))
}

fn transcription(parsed: &Parsed) -> Result<Reply, Reply> {
    let Parsed::Form(form) = parsed else {
        return Err(match parsed {
            Parsed::Invalid(msg) => bad_request(msg),
            _ => bad_request("expected a multipart/form-data body"),
        });
    };
    let size = form
        .part_len("file")
        .ok_or_else(|| bad_request("missing `file`"))?;
    let text = format!("mock transcript of {size} bytes");
    let format = form.field("response_format").unwrap_or_default();
    if matches!(format.trim(), "text" | "srt" | "vtt") {
        Ok(Reply::text(200, text))
    } else {
        Ok(Reply::json(200, &json!({"text": text})))
    }
}

fn speech(parsed: &Parsed) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    let input = body
        .get("input")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_request("missing `input`"))?;
    Ok(Reply {
        status: 200,
        content_type: "audio/mpeg",
        body: ReplyBody::Full(Bytes::from(speech_bytes(input))),
    })
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

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

fn add_echo_headers(header: &mut ResponseHeader, echo: &Echo) -> pingora_error::Result<()> {
    header.insert_header("x-mock-model", header_value(echo.model.as_bytes()))?;
    header.insert_header("x-mock-authorization", header_value(&echo.authorization))?;
    header.insert_header("x-mock-body-len", echo.body_len.to_string())?;
    header.insert_header("x-mock-body-sha256", echo.body_sha256.as_str())?;
    header.insert_header("x-mock-path", header_value(echo.path.as_bytes()))?;
    Ok(())
}

async fn write_reply(
    session: &mut ServerSession,
    reply: Reply,
    echo: &Echo,
    ov: &Overrides,
) -> pingora_error::Result<()> {
    let mut header = ResponseHeader::build(reply.status, Some(12))?;
    header.insert_header("content-type", reply.content_type)?;
    add_echo_headers(&mut header, echo)?;
    match reply.body {
        ReplyBody::Full(body) => {
            header.insert_header("content-length", body.len().to_string())?;
            session.write_response_header(Box::new(header)).await?;
            if !body.is_empty() {
                session.write_response_body(body, true).await?;
            }
        }
        ReplyBody::Events(events) => {
            header.insert_header("cache-control", "no-cache")?;
            header.insert_header("transfer-encoding", "chunked")?;
            session.write_response_header(Box::new(header)).await?;
            write_events(session, events, ov).await?;
        }
    }
    Ok(())
}

async fn write_events(
    session: &mut ServerSession,
    events: Vec<Bytes>,
    ov: &Overrides,
) -> pingora_error::Result<()> {
    let delay = Duration::from_millis(ov.delay_ms);
    if let Some(k) = ov.split {
        let pieces = split_pieces(&events, k);
        let last = pieces.len().saturating_sub(1);
        for (i, (piece, at_boundary)) in pieces.into_iter().enumerate() {
            session.write_response_body(piece, false).await?;
            if i < last {
                let pause = if at_boundary && !delay.is_zero() {
                    delay
                } else {
                    SPLIT_PAUSE
                };
                tokio::time::sleep(pause).await;
            }
        }
    } else {
        let n = ov.cut_after.unwrap_or(usize::MAX);
        for (i, event) in events.into_iter().take(n).enumerate() {
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            session.write_response_body(event, false).await?;
        }
        if ov.cut_after.is_some() {
            // Dropping the session without its final chunk cuts the stream mid-reply.
            return pingora_error::Error::e_explain(
                pingora_error::ErrorType::ConnectionClosed,
                "x-mock-cut-after",
            );
        }
    }
    Ok(())
}

/// `x-mock-garbage`: announce 100 bytes, send 10, then close the connection.
async fn write_garbage(session: &mut ServerSession, echo: &Echo) {
    session.set_keepalive(None);
    let result: pingora_error::Result<()> = async {
        let mut header = ResponseHeader::build(200, Some(8))?;
        header.insert_header("content-type", "application/json")?;
        header.insert_header("content-length", "100")?;
        add_echo_headers(&mut header, echo)?;
        session.write_response_header(Box::new(header)).await?;
        session
            .write_response_body(Bytes::from_static(b"{\"partial\""), false)
            .await?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        log::debug!("mock upstream: garbage reply failed early: {e}");
    }
    // Flushes what was buffered, then closes the write side.
    session.shutdown().await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn overrides(chunks: usize) -> Overrides {
        Overrides {
            chunks,
            delay_ms: 0,
            split: None,
            status: None,
            ignore_include_usage: false,
            garbage: false,
            cut_after: None,
        }
    }

    fn body_json(reply: &Reply) -> Value {
        match &reply.body {
            ReplyBody::Full(b) => serde_json::from_slice(b).unwrap(),
            ReplyBody::Events(_) => panic!("expected a full body"),
        }
    }

    fn event_json(events: &[Bytes]) -> Vec<Value> {
        events
            .iter()
            .map(|e| {
                let text = std::str::from_utf8(e).unwrap();
                let data = text
                    .strip_prefix("data: ")
                    .unwrap()
                    .strip_suffix("\n\n")
                    .unwrap();
                if data == "[DONE]" {
                    Value::String("[DONE]".into())
                } else {
                    serde_json::from_str(data).unwrap()
                }
            })
            .collect()
    }

    #[test]
    fn words_are_counted() {
        assert_eq!(count_words(""), 0);
        assert_eq!(count_words("  hello   world\n again\t"), 3);
        let body = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "one two three"},
                {"type": "image_url", "image_url": {"url": "http://x/y z"}},
            ]},
            {"role": "assistant", "content": null},
        ]});
        assert_eq!(chat_prompt_tokens(body.as_object().unwrap()), 5);
        let empty = json!({"messages": []});
        assert_eq!(chat_prompt_tokens(empty.as_object().unwrap()), 1);
        let prompts = json!({"prompt": ["a b", "c"]});
        assert_eq!(completion_prompt_tokens(prompts.as_object().unwrap()), 3);
    }

    #[test]
    fn reply_text_is_deterministic() {
        assert_eq!(reply_text(0), "");
        assert_eq!(reply_text(1), "Hello");
        assert_eq!(reply_text(3), "Hello from the");
        assert_eq!(
            reply_text(12),
            "Hello from the mock café naïve ✓ 日本語 model upstream Hello from"
        );
        let tokens = reply_tokens(4);
        assert_eq!(tokens, vec!["Hello ", "from ", "the ", "mock"]);
    }

    #[test]
    fn embedding_base64_is_little_endian_f32() {
        let v = [1.0f32, 0.5];
        assert_eq!(embedding_base64(&v), "AACAPwAAAD8=");
        let e = embedding_vector(b"hello");
        let decoded = BASE64.decode(embedding_base64(&e)).unwrap();
        assert_eq!(decoded.len(), 32);
        let back: Vec<f32> = decoded
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(back, e.to_vec());
        // sha256("hello") starts with 0x2c.
        assert_eq!(e[0], 44.0 / 255.0);
        assert!(e.iter().all(|x| (0.0..=1.0).contains(x)));
    }

    #[test]
    fn embedding_inputs_are_parsed() {
        assert_eq!(embedding_inputs(&json!("a")).unwrap().len(), 1);
        assert_eq!(embedding_inputs(&json!(["a", "b c"])).unwrap().len(), 2);
        assert_eq!(
            embedding_inputs(&json!([1, 2, 3])).unwrap(),
            vec![EmbeddingInput::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(embedding_inputs(&json!([[1], [2, 3]])).unwrap().len(), 2);
        assert!(embedding_inputs(&json!([])).is_none());
        assert!(embedding_inputs(&json!([{"x": 1}])).is_none());
        assert!(embedding_inputs(&json!(5)).is_none());
    }

    #[test]
    fn sse_events_are_built() {
        assert_eq!(
            sse_event(&json!({"a": "é"})),
            Bytes::from("data: {\"a\":\"é\"}\n\n")
        );
        let tokens = reply_tokens(3);
        let spec = StreamSpec {
            id: "chatcmpl-mock-1",
            created: 7,
            model: "m",
            prompt_tokens: 2,
            tokens: &tokens,
            include_usage: false,
        };
        let events = event_json(&chat_stream_events(&spec));
        assert_eq!(events.len(), 6);
        assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(events[1]["choices"][0]["delta"]["content"], "Hello ");
        assert!(events[1]["choices"][0]["finish_reason"].is_null());
        assert_eq!(events[4]["choices"][0]["finish_reason"], "stop");
        assert_eq!(events[5], "[DONE]");
        assert!(events[..5].iter().all(|e| e.get("usage").is_none()));
        assert!(events[..5].iter().all(|e| e["id"] == "chatcmpl-mock-1"));

        let spec = StreamSpec {
            include_usage: true,
            ..spec
        };
        let events = event_json(&chat_stream_events(&spec));
        assert_eq!(events.len(), 7);
        assert!(events[..5].iter().all(|e| e["usage"].is_null()));
        assert_eq!(events[5]["choices"], json!([]));
        assert_eq!(events[5]["usage"]["total_tokens"], 5);

        let events = event_json(&completion_stream_events(&spec));
        assert_eq!(events.len(), 6);
        assert_eq!(events[0]["object"], "text_completion");
        assert_eq!(events[2]["choices"][0]["text"], "the");
        assert_eq!(events[3]["choices"][0]["finish_reason"], "stop");
        assert_eq!(events[4]["usage"]["completion_tokens"], 3);
    }

    #[test]
    fn split_pieces_cover_the_stream() {
        let events = vec![Bytes::from("data: 1\n\n"), Bytes::from("data: ✓\n\n")];
        let pieces = split_pieces(&events, 4);
        let joined: Vec<u8> = pieces.iter().flat_map(|(p, _)| p.to_vec()).collect();
        assert_eq!(joined, b"data: 1\n\ndata: \xe2\x9c\x93\n\n".to_vec());
        assert!(pieces.iter().all(|(p, _)| p.len() <= 4));
        assert_eq!(pieces.iter().filter(|(_, b)| *b).count(), 2);
        assert!(pieces.last().unwrap().1);
    }

    #[test]
    fn chat_reply_shapes() {
        let parsed = Parsed::Json(json!({
            "model": "gpt-x",
            "messages": [{"role": "user", "content": "hi there"}],
        }));
        let reply = route(
            &Method::POST,
            "/v1/chat/completions",
            &parsed,
            &overrides(2),
            &parsed.model(),
        );
        assert_eq!(reply.status, 200);
        let v = body_json(&reply);
        assert_eq!(v["model"], "gpt-x");
        assert_eq!(v["choices"][0]["message"]["content"], "Hello from");
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4})
        );

        let bad = Parsed::Invalid("nope".into());
        let reply = route(
            &Method::POST,
            "/v1/chat/completions",
            &bad,
            &overrides(2),
            "",
        );
        assert_eq!(reply.status, 400);
        assert!(body_json(&reply)["error"]["message"].is_string());

        let reply = route(&Method::GET, "/nope", &Parsed::Empty, &overrides(2), "");
        assert_eq!(reply.status, 404);
        assert_eq!(body_json(&reply)["error"]["code"], "not_found");
    }

    #[test]
    fn misc_helpers() {
        let speech = speech_bytes("hi");
        assert_eq!(speech.len(), SPEECH_LEN);
        assert!(speech.starts_with(b"ID3"));
        assert_eq!(header_value(b"a\x01b").as_bytes(), b"ab");
        assert_eq!(forced_error(429).status, 429);
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

    #[tokio::test]
    async fn multipart_is_parsed() {
        let body = Bytes::from(
            "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n\
             --XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
             Content-Type: audio/wav\r\n\r\n12345\r\n--XyZ--\r\n",
        );
        let parsed = parse_body("multipart/form-data; boundary=XyZ", body).await;
        assert_eq!(parsed.model(), "whisper-1");
        let reply = transcription(&parsed).unwrap();
        assert_eq!(body_json(&reply)["text"], "mock transcript of 5 bytes");
        let broken = parse_body("multipart/form-data; boundary=XyZ", Bytes::from("junk")).await;
        assert!(matches!(broken, Parsed::Invalid(_)));
    }
}
