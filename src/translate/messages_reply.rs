//! Anthropic Messages replies: an Anthropic pool's reply or stream read, and a reply or a
//! stream's events written as the API's own (`message`, `message_start` … `message_stop`).

use serde_json::{Value, json};

use super::ir::*;
use super::messages::text_of;

fn stop_of(reason: &str, sequence: Option<&str>) -> Stop {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => Stop::MaxTokens,
        "stop_sequence" => Stop::StopSequence(sequence.map(str::to_string)),
        "tool_use" => Stop::ToolUse,
        "refusal" => Stop::Refusal,
        "pause_turn" => Stop::Pause,
        _ => Stop::End,
    }
}

/// Reads a `usage` object's fields into `u` (those it has).
fn read_usage(v: &Value, u: &mut Usage) {
    let field = |name: &str| v.get(name).and_then(Value::as_u64);
    if let Some(n) = field("input_tokens") {
        u.input = n;
    }
    if let Some(n) = field("output_tokens") {
        u.output = n;
    }
    if let Some(n) = field("cache_read_input_tokens") {
        u.cache_read = n;
    }
    if let Some(n) = field("cache_creation_input_tokens") {
        u.cache_write = n;
    }
}

/// A content block of a reply (read as a request's block is; a reply has only these kinds).
fn reply_part(b: &Value) -> Option<Part> {
    let part = super::messages::read_block(b).ok()?;
    matches!(
        part,
        Part::Text { .. }
            | Part::Thinking { .. }
            | Part::RedactedThinking { .. }
            | Part::ToolCall { .. }
    )
    .then_some(part)
}

/// Reads a whole reply (None: not a message).
pub fn read_reply(body: &[u8]) -> Option<Reply> {
    let v: Value = serde_json::from_slice(body).ok()?;
    if v.get("type").and_then(Value::as_str) != Some("message") {
        return None;
    }
    let mut usage = Usage::default();
    if let Some(u) = v.get("usage") {
        read_usage(u, &mut usage);
    }
    let parts = v.get("content").and_then(Value::as_array);
    Some(Reply {
        id: text_of(&v, "id"),
        model: text_of(&v, "model"),
        parts: parts.into_iter().flatten().filter_map(reply_part).collect(),
        stop: stop_of(
            v.get("stop_reason").and_then(Value::as_str).unwrap_or(""),
            v.get("stop_sequence").and_then(Value::as_str),
        ),
        usage,
    })
}

/// Reads a stream's events.
#[derive(Debug, Default)]
pub struct StreamIn {
    usage: Usage,
}

impl StreamIn {
    /// One event's data (its `type` says what it is; the SSE name repeats it).
    pub fn event(&mut self, data: &[u8], out: &mut Vec<Event>) {
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                let m = v.get("message").unwrap_or(&Value::Null);
                out.push(Event::Start {
                    id: text_of(m, "id"),
                    model: text_of(m, "model"),
                });
                if let Some(u) = m.get("usage") {
                    read_usage(u, &mut self.usage);
                    out.push(Event::Usage(self.usage));
                }
            }
            "content_block_start" => block_start(index, v.get("content_block"), out),
            "content_block_delta" => delta(index, v.get("delta").unwrap_or(&Value::Null), out),
            "content_block_stop" => out.push(Event::BlockStop { index }),
            "message_delta" => {
                if let Some(u) = v.get("usage") {
                    read_usage(u, &mut self.usage);
                    out.push(Event::Usage(self.usage));
                }
                let d = v.get("delta").unwrap_or(&Value::Null);
                if let Some(r) = d.get("stop_reason").and_then(Value::as_str) {
                    let seq = d.get("stop_sequence").and_then(Value::as_str);
                    out.push(Event::Stop(stop_of(r, seq)));
                }
            }
            "message_stop" => out.push(Event::End),
            "error" => {
                let e = v.get("error").unwrap_or(&Value::Null);
                out.push(Event::Error {
                    kind: text_of(e, "type"),
                    message: text_of(e, "message"),
                });
            }
            _ => {}
        }
    }
}

fn block_start(index: usize, b: Option<&Value>, out: &mut Vec<Event>) {
    let Some(b) = b else { return };
    match b.get("type").and_then(Value::as_str).unwrap_or("") {
        "text" => {
            out.push(Event::TextStart { index });
            let text = text_of(b, "text");
            if !text.is_empty() {
                out.push(Event::Text { index, text });
            }
        }
        "thinking" => out.push(Event::ThinkingStart { index }),
        "redacted_thinking" => out.push(Event::RedactedThinking {
            index,
            data: text_of(b, "data"),
        }),
        "tool_use" => {
            out.push(Event::ToolStart {
                index,
                id: text_of(b, "id"),
                name: text_of(b, "name"),
            });
            // The input comes in deltas; one given whole here is passed on as one.
            let input = b
                .get("input")
                .filter(|i| i.as_object().is_some_and(|o| !o.is_empty()));
            if let Some(i) = input {
                out.push(Event::ToolArguments {
                    index,
                    json: i.to_string(),
                });
            }
        }
        _ => {}
    }
}

fn delta(index: usize, d: &Value, out: &mut Vec<Event>) {
    let e = match d.get("type").and_then(Value::as_str).unwrap_or("") {
        "text_delta" => Event::Text {
            index,
            text: text_of(d, "text"),
        },
        "thinking_delta" => Event::Thinking {
            index,
            text: text_of(d, "thinking"),
        },
        "signature_delta" => Event::Signature {
            index,
            signature: text_of(d, "signature"),
        },
        "input_json_delta" => Event::ToolArguments {
            index,
            json: text_of(d, "partial_json"),
        },
        _ => return,
    };
    out.push(e);
}

fn stop_reason(stop: &Stop) -> (&'static str, Option<&str>) {
    match stop {
        Stop::End => ("end_turn", None),
        Stop::MaxTokens => ("max_tokens", None),
        Stop::StopSequence(s) => ("stop_sequence", s.as_deref()),
        Stop::ToolUse => ("tool_use", None),
        Stop::Refusal => ("refusal", None),
        Stop::Pause => ("pause_turn", None),
    }
}

/// The `usage` object, each token in one field (Anthropic's `input_tokens` leaves the cache
/// out).
pub fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input, "output_tokens": u.output,
        "cache_creation_input_tokens": u.cache_write, "cache_read_input_tokens": u.cache_read,
    })
}

fn block(p: &Part) -> Option<Value> {
    Some(match p {
        Part::Text { text, .. } => json!({"type": "text", "text": text}),
        // A reasoning the provider did not sign goes with an empty signature (the field is
        // required; the next turn's translation drops what has none).
        Part::Thinking { text, signature } => json!({"type": "thinking", "thinking": text,
                                                      "signature": signature.as_deref().unwrap_or("")}),
        Part::RedactedThinking { data } => json!({"type": "redacted_thinking", "data": data}),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => {
            let input: Value = serde_json::from_str(arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
        _ => return None,
    })
}

/// A whole reply as a `message`.
pub fn write_reply(r: &Reply) -> Vec<u8> {
    let (reason, sequence) = stop_reason(&r.stop);
    let out = json!({
        "id": r.id, "type": "message", "role": "assistant", "model": r.model,
        "content": r.parts.iter().filter_map(block).collect::<Vec<_>>(),
        "stop_reason": reason, "stop_sequence": sequence, "usage": usage(&r.usage),
    });
    out.to_string().into_bytes()
}

/// Writes a stream's events as Anthropic's (`message_start` … `message_stop`).
#[derive(Debug, Default)]
pub struct StreamOut {
    usage: Usage,
    stop: Stop,
    done: bool,
}

impl StreamOut {
    fn send(out: &mut Vec<u8>, name: &str, data: &Value) {
        super::sse::write(out, Some(name), data.to_string().as_bytes());
    }

    fn start(out: &mut Vec<u8>, index: usize, block: Value) {
        Self::send(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
    }

    fn delta(out: &mut Vec<u8>, index: usize, delta: Value) {
        Self::send(
            out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
    }

    pub fn event(&mut self, e: Event, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        match e {
            Event::Start { id, model } => {
                let message = json!({"id": id, "type": "message", "role": "assistant",
                    "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": usage(&self.usage)});
                Self::send(
                    out,
                    "message_start",
                    &json!({"type": "message_start", "message": message}),
                );
            }
            Event::TextStart { index } => {
                Self::start(out, index, json!({"type": "text", "text": ""}));
            }
            Event::Text { index, text } => {
                Self::delta(out, index, json!({"type": "text_delta", "text": text}));
            }
            Event::ThinkingStart { index } => {
                Self::start(
                    out,
                    index,
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                );
            }
            Event::Thinking { index, text } => {
                Self::delta(
                    out,
                    index,
                    json!({"type": "thinking_delta", "thinking": text}),
                );
            }
            Event::Signature { index, signature } => {
                Self::delta(
                    out,
                    index,
                    json!({"type": "signature_delta", "signature": signature}),
                );
            }
            Event::RedactedThinking { index, data } => {
                Self::start(
                    out,
                    index,
                    json!({"type": "redacted_thinking", "data": data}),
                );
            }
            Event::ToolStart { index, id, name } => {
                Self::start(
                    out,
                    index,
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                );
            }
            Event::ToolArguments { index, json } => {
                Self::delta(
                    out,
                    index,
                    json!({"type": "input_json_delta", "partial_json": json}),
                );
            }
            Event::BlockStop { index } => Self::send(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ),
            Event::Usage(u) => self.usage = u,
            Event::Stop(s) => self.stop = s,
            Event::Error { kind, message } => {
                let e = json!({"type": "error", "error": {"type": super::errors::anthropic_kind(&kind), "message": message}});
                Self::send(out, "error", &e);
                self.done = true;
            }
            Event::End => {
                let (reason, sequence) = stop_reason(&self.stop);
                Self::send(
                    out,
                    "message_delta",
                    &json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(&self.usage)}),
                );
                Self::send(out, "message_stop", &json!({"type": "message_stop"}));
                self.done = true;
            }
        }
    }
}
