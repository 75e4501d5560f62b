//! The mock's Anthropic Messages API (`/v1/messages`, plain and streamed, and
//! `/v1/messages/count_tokens`), as the API reference describes it: text, tool use (when the
//! request offers tools and the conversation does not end in their results), thinking blocks
//! with signatures it checks when they come back, and cache usage. Words are tokens, as
//! everywhere in the mock; the reply text is the same as for chat.
//! - A request with `cache_control` on a block reports the prompt up to the last such block
//!   as read from the cache (`cache_read_input_tokens`), or as written to it with
//!   `x-mock-cache-write: 1` (`cache_creation_input_tokens`).
//! - `x-mock-tool-calls: N`: N tool calls in one turn (unless parallel use is disabled).

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::apis::named_event as event;
use super::errors::bad_request;
use super::replies::{Reply, json_object, model_or_default, next_id};
use super::request::{Overrides, Parsed};
use super::tokens::{count_words, reply_tokens};

/// Words of a text, or of content blocks (text, tool results).
fn words(v: &Value) -> usize {
    match v {
        Value::String(s) => count_words(s),
        Value::Array(items) => items.iter().map(words).sum(),
        Value::Object(o) => o
            .get("text")
            .or_else(|| o.get("content"))
            .or_else(|| o.get("thinking"))
            .map_or(0, words),
        _ => 0,
    }
}

/// The prompt's tokens: (not cached, cached: the blocks up to the last `cache_control`).
fn prompt_tokens(body: &Map<String, Value>) -> (usize, usize) {
    let messages = body.get("messages").and_then(Value::as_array);
    let parts = [body.get("tools"), body.get("system")]
        .into_iter()
        .flatten()
        .chain(
            messages
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("content")),
        );
    let mut blocks: Vec<&Value> = Vec::new();
    for v in parts {
        match v {
            Value::Array(items) => blocks.extend(items.iter()),
            other => blocks.push(other),
        }
    }
    let counts: Vec<usize> = blocks
        .iter()
        .map(|b| match b.get("input_schema") {
            Some(schema) => count_words(&schema.to_string()),
            None => words(b),
        })
        .collect();
    let cached_to = blocks
        .iter()
        .rposition(|b| b.get("cache_control").is_some())
        .map_or(0, |i| i + 1);
    let cached: usize = counts[..cached_to].iter().sum();
    let rest: usize = counts[cached_to..].iter().sum();
    (rest.max(1), cached)
}

/// The signature the mock gives a thinking text (and checks when it comes back).
fn signature(thinking: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(thinking.as_bytes());
    format!("mocksig_{}", hex::encode(&digest[..12]))
}

/// The mock's reasoning: a fixed sentence.
pub(super) const THINKING: &str = "The user wants a reply; a short one will do.";

/// Checks what comes back of earlier turns: each thinking block signed by the mock, and (with
/// thinking on) every assistant turn that used a tool starting with its thinking, as the
/// real API requires.
fn check_history(body: &Map<String, Value>, thinking: bool) -> Result<(), Reply> {
    let messages = body.get("messages").and_then(Value::as_array);
    for m in messages.into_iter().flatten() {
        let Some(blocks) = m.get("content").and_then(Value::as_array) else {
            continue;
        };
        for b in blocks {
            if b.get("type").and_then(Value::as_str) == Some("thinking") {
                let text = b.get("thinking").and_then(Value::as_str).unwrap_or("");
                if b.get("signature").and_then(Value::as_str) != Some(&signature(text)) {
                    return Err(bad_request(
                        "messages: Invalid `signature` in `thinking` block",
                    ));
                }
            }
        }
        let assistant = m.get("role").and_then(Value::as_str) == Some("assistant");
        let uses_tool = blocks.iter().any(|b| b["type"] == "tool_use");
        let first = blocks
            .first()
            .and_then(|b| b.get("type"))
            .and_then(Value::as_str);
        if thinking
            && assistant
            && uses_tool
            && !matches!(first, Some("thinking" | "redacted_thinking"))
        {
            return Err(bad_request(
                "messages: Expected `thinking` or `redacted_thinking`, but found `tool_use`. \
                 When `thinking` is enabled, a final `assistant` message must start with a \
                 thinking block.",
            ));
        }
    }
    Ok(())
}

/// A value for a schema: what a model would fill in.
pub(super) fn sample(schema: &Value) -> Value {
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => json!("echo"),
        Some("integer") | Some("number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => {
            let props = schema.get("properties").and_then(Value::as_object);
            let out: Map<String, Value> = props
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), sample(v)))
                .collect();
            Value::Object(out)
        }
        _ => Value::Null,
    }
}

/// The tool calls of this turn: none when no tools are offered, the choice is `none`, or the
/// conversation ends in tool results (the model answers them).
fn tool_calls(body: &Map<String, Value>, ov: &Overrides) -> Vec<(String, String, Value)> {
    let tools: Vec<&Value> = body
        .get("tools")
        .and_then(Value::as_array)
        .map(|t| t.iter().collect())
        .unwrap_or_default();
    let choice = body.get("tool_choice").unwrap_or(&Value::Null);
    let last = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last());
    let answered = last
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"));
    if tools.is_empty() || choice["type"] == "none" || answered {
        return Vec::new();
    }
    let named = choice["name"].as_str();
    let chosen: Vec<&Value> = match named {
        Some(n) => tools.into_iter().filter(|t| t["name"] == n).collect(),
        None => tools,
    };
    let mut n = ov.tool_calls.unwrap_or(1).max(1);
    if choice["disable_parallel_tool_use"] == true {
        n = 1;
    }
    (0..n)
        .filter_map(|i| {
            let t = chosen.get(i % chosen.len().max(1))?;
            let name = t["name"].as_str().unwrap_or("tool").to_string();
            Some((next_id("toolu_mock"), name, sample(&t["input_schema"])))
        })
        .collect()
}

pub(super) fn messages(parsed: &Parsed, ov: &Overrides, model: &str) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    if body.get("max_tokens").and_then(Value::as_u64).is_none() {
        return Err(bad_request("max_tokens: Field required"));
    }
    let thinking = body
        .get("thinking")
        .and_then(|t| t.get("type"))
        .is_some_and(|t| t == "enabled" || t == "adaptive");
    check_history(body, thinking)?;
    let (input, cached) = prompt_tokens(body);
    let (cache_read, cache_write) = if ov.cache_write {
        (0, cached)
    } else {
        (cached, 0)
    };
    let calls = tool_calls(body, ov);
    let tokens = reply_tokens(if calls.is_empty() { ov.chunks } else { 3 });
    let stop = if !calls.is_empty() {
        "tool_use"
    } else if ov.length_limited {
        "max_tokens"
    } else {
        "end_turn"
    };
    let output = tokens.len()
        + if thinking { count_words(THINKING) } else { 0 }
        + calls
            .iter()
            .map(|c| count_words(&c.2.to_string()))
            .sum::<usize>();
    let reply = Turn {
        id: next_id("msg_mock"),
        model: model_or_default(model).to_string(),
        thinking,
        tokens,
        calls,
        stop,
        usage: json!({"input_tokens": input, "output_tokens": output,
                      "cache_creation_input_tokens": cache_write,
                      "cache_read_input_tokens": cache_read}),
    };
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    if !stream || ov.plain_reply {
        return Ok(Reply::json(200, &reply.whole()));
    }
    Ok(Reply::events(reply.events()))
}

/// One turn of the mock model.
struct Turn {
    id: String,
    model: String,
    thinking: bool,
    tokens: Vec<String>,
    calls: Vec<(String, String, Value)>,
    stop: &'static str,
    usage: Value,
}

impl Turn {
    fn whole(&self) -> Value {
        let mut content = Vec::new();
        if self.thinking {
            content.push(json!({"type": "thinking", "thinking": THINKING,
                                "signature": signature(THINKING)}));
        }
        content.push(json!({"type": "text", "text": self.tokens.concat()}));
        for (id, name, input) in &self.calls {
            content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": self.stop, "stop_sequence": null,
            "usage": self.usage,
        })
    }

    fn events(&self) -> Vec<Bytes> {
        let mut start_usage = self.usage.clone();
        start_usage["output_tokens"] = json!(1);
        let mut out = vec![
            event(
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage,
                }}),
            ),
            event("ping", &json!({"type": "ping"})),
        ];
        let mut index = 0;
        let mut block = |out: &mut Vec<Bytes>, start: Value, deltas: Vec<Value>| {
            out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": start}),
            ));
            for d in deltas {
                out.push(event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index, "delta": d}),
                ));
            }
            out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
            index += 1;
        };
        if self.thinking {
            let mut deltas: Vec<Value> = THINKING
                .split_inclusive(' ')
                .map(|w| json!({"type": "thinking_delta", "thinking": w}))
                .collect();
            deltas.push(json!({"type": "signature_delta", "signature": signature(THINKING)}));
            block(
                &mut out,
                json!({"type": "thinking", "thinking": ""}),
                deltas,
            );
        }
        let text = self
            .tokens
            .iter()
            .map(|t| json!({"type": "text_delta", "text": t}))
            .collect();
        block(&mut out, json!({"type": "text", "text": ""}), text);
        for (id, name, input) in &self.calls {
            // The input in pieces, split anywhere (as the API does).
            let s = input.to_string();
            let cut = s.len() / 2;
            let cut = (0..=cut)
                .rev()
                .find(|i| s.is_char_boundary(*i))
                .unwrap_or(0);
            let pieces = [&s[..cut], &s[cut..]]
                .map(|p| json!({"type": "input_json_delta", "partial_json": p}));
            let start = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
            block(&mut out, start, pieces.to_vec());
        }
        out.push(event(
            "message_delta",
            &json!({"type": "message_delta",
            "delta": {"stop_reason": self.stop, "stop_sequence": null},
            "usage": {"output_tokens": self.usage["output_tokens"]}}),
        ));
        out.push(event("message_stop", &json!({"type": "message_stop"})));
        out
    }
}

pub(super) fn count_tokens(parsed: &Parsed) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    let (input, cached) = prompt_tokens(body);
    Ok(Reply::json(200, &json!({"input_tokens": input + cached})))
}
