//! Streamed replies of the mock: the SSE events of chat and legacy completions (`[DONE]`
//! included, usage chunk on request), and writing them with the pauses, byte splits and cuts
//! that `x-mock-*` headers ask for.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora_core::protocols::http::ServerSession;
use serde_json::{Value, json};

use super::request::Overrides;
use super::tokens::usage_json;

/// Pause between the pieces of a split (`x-mock-split`) stream.
const SPLIT_PAUSE: Duration = Duration::from_millis(2);

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

/// `x-mock-usage-shape` (comma-separated): where the usage of a stream goes, as real
/// OpenAI-compatible servers differ. Default: OpenAI's (a last event with `choices: []`,
/// `"usage": null` on the others, then `[DONE]`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct UsageShape {
    /// `empty-delta`: the usage event has one choice with an empty delta.
    pub(super) empty_delta: bool,
    /// `on-last`: usage on the final content event, no event of its own, no nulls before.
    pub(super) on_last: bool,
    /// `null-always`: `"usage": null` on every event, asked for or not.
    pub(super) null_always: bool,
    /// `no-done`: no `data: [DONE]` at the end.
    pub(super) no_done: bool,
}

impl UsageShape {
    pub(super) fn parse(v: &str) -> UsageShape {
        let mut shape = UsageShape::default();
        for word in v.split(',').map(str::trim) {
            match word {
                "empty-delta" => shape.empty_delta = true,
                "on-last" => shape.on_last = true,
                "null-always" => shape.null_always = true,
                "no-done" => shape.no_done = true,
                _ => {}
            }
        }
        shape
    }

    /// Whether an event that carries no counts gets `"usage": null`.
    fn null_member(self, include_usage: bool) -> bool {
        self.null_always || (include_usage && !self.on_last)
    }
}

/// Everything a streamed reply needs to know.
pub(super) struct StreamSpec<'a> {
    pub(super) id: &'a str,
    pub(super) created: u64,
    pub(super) model: &'a str,
    pub(super) prompt_tokens: usize,
    pub(super) tokens: &'a [String],
    pub(super) include_usage: bool,
    pub(super) shape: UsageShape,
    /// What the usage says instead of the true counts (`x-mock-usage`).
    pub(super) usage: Option<&'a Value>,
    /// The finish reason: `stop`, or `length` when the reply was cut to the output limit.
    pub(super) finish: &'static str,
}

impl StreamSpec<'_> {
    /// The usage event (chat or completions), or None when the usage rides on the last event.
    fn usage_event(&self, object: &str, empty_choice: Value) -> Option<Bytes> {
        if !self.include_usage || self.shape.on_last {
            return None;
        }
        let choices = if self.shape.empty_delta {
            json!([empty_choice])
        } else {
            json!([])
        };
        Some(sse_event(&json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.counts(),
        })))
    }

    fn counts(&self) -> Value {
        self.usage
            .cloned()
            .unwrap_or_else(|| usage_json(self.prompt_tokens, self.tokens.len()))
    }

    /// The final content event gets the counts in the `on-last` shape.
    fn finish(&self, mut chunk: Value) -> Value {
        if self.include_usage && self.shape.on_last {
            set_field(&mut chunk, "usage", self.counts());
        }
        chunk
    }

    fn end(&self, events: &mut Vec<Bytes>) {
        if !self.shape.no_done {
            events.push(sse_done());
        }
    }
}

fn chat_chunk(spec: &StreamSpec<'_>, delta: Value, finish_reason: Value) -> Value {
    let mut chunk = json!({
        "id": spec.id,
        "object": "chat.completion.chunk",
        "created": spec.created,
        "model": spec.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
    });
    if spec.shape.null_member(spec.include_usage) {
        set_field(&mut chunk, "usage", Value::Null);
    }
    chunk
}

/// The SSE events of a streamed chat completion, `[DONE]` included.
pub(super) fn chat_stream_events(spec: &StreamSpec<'_>) -> Vec<Bytes> {
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
    events.push(sse_event(&spec.finish(chat_chunk(
        spec,
        json!({}),
        json!(spec.finish),
    ))));
    let empty = json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": null});
    events.extend(spec.usage_event("chat.completion.chunk", empty));
    spec.end(&mut events);
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
    if spec.shape.null_member(spec.include_usage) {
        set_field(&mut chunk, "usage", Value::Null);
    }
    chunk
}

/// The SSE events of a streamed legacy completion, `[DONE]` included.
pub(super) fn completion_stream_events(spec: &StreamSpec<'_>) -> Vec<Bytes> {
    let mut events = Vec::with_capacity(spec.tokens.len() + 3);
    for token in spec.tokens {
        events.push(sse_event(&completion_chunk(spec, token, Value::Null)));
    }
    events.push(sse_event(&spec.finish(completion_chunk(
        spec,
        "",
        json!(spec.finish),
    ))));
    let empty = json!({"index": 0, "text": "", "logprobs": null, "finish_reason": null});
    events.extend(spec.usage_event("text_completion", empty));
    spec.end(&mut events);
    events
}

pub(super) async fn write_events(
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mock_upstream::tokens::reply_tokens;

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
            shape: UsageShape::default(),
            usage: None,
            finish: "stop",
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
}
