//! Per-endpoint replies of the mock: `route` maps method and path to a reply built from the
//! parsed request (chat, completions, embeddings, moderations, images, audio, models). Apart
//! from ids and `created`, every reply is a pure function of the request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http::Method;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::errors::{bad_request, not_found};
use super::request::{Overrides, Parsed};
use super::stream::{StreamSpec, chat_stream_events, completion_stream_events};
use super::tokens::{
    chat_prompt_tokens, completion_prompt_tokens, count_words, reply_tokens, usage_json,
};

/// The only model the mock lists.
const MOCK_MODEL_ID: &str = "echo-1";
/// Upper bound for the number of generated images.
const MAX_IMAGES: usize = 16;
/// Length of the `/v1/audio/speech` reply body.
const SPEECH_LEN: usize = 4096;
/// The "image" every image endpoint returns (base64-encoded in `b64_json`).
const MOCK_IMAGE: &[u8] = b"\x89PNG\r\n\x1a\nmodelgate-mock-image";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(super) fn delays_header(reply: &Reply) -> bool {
    !matches!(reply.body, ReplyBody::Events(_))
}

#[derive(Debug)]
pub(super) enum ReplyBody {
    /// A complete body sent with Content-Length.
    Full(Bytes),
    /// Server-sent events sent with chunked transfer encoding.
    Events(Vec<Bytes>),
}

#[derive(Debug)]
pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) content_type: &'static str,
    pub(super) body: ReplyBody,
}

impl Reply {
    pub(super) fn json(status: u16, value: &Value) -> Self {
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

    pub(super) fn events(events: Vec<Bytes>) -> Self {
        Reply {
            status: 200,
            content_type: "text/event-stream",
            body: ReplyBody::Events(events),
        }
    }
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(super) fn next_id(prefix: &str) -> String {
    format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
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
pub(super) fn json_object(parsed: &Parsed) -> Result<&Map<String, Value>, Reply> {
    match parsed {
        Parsed::Json(Value::Object(obj)) => Ok(obj),
        Parsed::Json(_) => Err(bad_request("request body must be a JSON object")),
        Parsed::Empty => Err(bad_request("missing JSON request body")),
        Parsed::Form(_) => Err(bad_request("expected a JSON body, got multipart/form-data")),
        Parsed::Invalid(msg) => Err(bad_request(msg)),
    }
}

pub(super) fn model_or_default(model: &str) -> &str {
    if model.is_empty() {
        MOCK_MODEL_ID
    } else {
        model
    }
}

/// Answers a (fully read) request. `model` is the received model value.
pub(super) fn route(
    method: &Method,
    path: &str,
    parsed: &Parsed,
    ov: &Overrides,
    model: &str,
) -> Reply {
    let get = method == Method::GET || method == Method::HEAD;
    let post = method == Method::POST;
    let result = match path {
        "/v1/models" if get => Ok(models_reply()),
        "/health" | "/healthz" if get => Ok(Reply::text(200, "ok".to_string())),
        // `/v1/generate` stands for a model server's own path that streams as chat does (an
        // `other` endpoint to the gateway).
        "/v1/chat/completions" | "/v1/generate" if post => chat_completions(parsed, ov, model),
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
        "/v1/rerank" | "/v1/score" if post => rerank(parsed, model),
        _ => Ok(not_found()),
    };
    result.unwrap_or_else(|err| err)
}

/// vLLM's rerank/score shape: a relevance per document, and `usage` with the prompt tokens
/// (query and documents, a token a word).
fn rerank(parsed: &Parsed, model: &str) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    let query = body.get("query").and_then(Value::as_str).unwrap_or("");
    let docs: Vec<&str> = body
        .get("documents")
        .and_then(Value::as_array)
        .map(|d| d.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let words = |s: &str| s.split_whitespace().count();
    let tokens = words(query) * docs.len().max(1) + docs.iter().map(|d| words(d)).sum::<usize>();
    let results: Vec<Value> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| json!({"index": i, "relevance_score": 1.0 / (1.0 + words(d) as f64)}))
        .collect();
    Ok(Reply::json(
        200,
        &json!({
            "id": "rerank-mock",
            "model": model_or_default(model),
            "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }),
    ))
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
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true) && !ov.plain_reply;
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
    if let Some(turn) = super::chat_turn::reply(body, ov, model, stream) {
        return Ok(turn);
    }
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
            shape: ov.usage_shape,
            usage: ov.usage.as_ref(),
            finish: ov.finish(),
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
                "finish_reason": ov.finish(),
            }],
            "usage": ov.usage.clone().unwrap_or_else(|| usage_json(prompt_tokens, tokens.len())),
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
            shape: ov.usage_shape,
            usage: ov.usage.as_ref(),
            finish: ov.finish(),
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
            "choices": [{"index": 0, "text": tokens.concat(), "logprobs": null, "finish_reason": ov.finish()}],
            "usage": ov.usage.clone().unwrap_or_else(|| usage_json(prompt_tokens, tokens.len())),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mock_upstream::request::parse_body;

    fn overrides(chunks: usize) -> Overrides {
        Overrides {
            chunks,
            delay_ms: 0,
            split: None,
            status: None,
            ignore_include_usage: false,
            garbage: false,
            cut_after: None,
            empty_body: false,
            text_body: false,
            retry_after: None,
            usage_shape: Default::default(),
            usage: None,
            informational: None,
            html: false,
            close_delimited: false,
            body_delay_ms: 0,
            provider_headers: false,
            echoed_request_id: None,
            gzip: false,
            pad_bytes: None,
            plain_reply: false,
            ignore_max_tokens: false,
            length_limited: false,
            tool_calls: None,
            cache_write: false,
        }
    }

    fn body_json(reply: &Reply) -> Value {
        match &reply.body {
            ReplyBody::Full(b) => serde_json::from_slice(b).unwrap(),
            ReplyBody::Events(_) => panic!("expected a full body"),
        }
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
    fn speech_is_id3_then_a_digest_to_4096_bytes() {
        let speech = speech_bytes("hi");
        assert_eq!(speech.len(), SPEECH_LEN);
        assert!(speech.starts_with(b"ID3"));
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
