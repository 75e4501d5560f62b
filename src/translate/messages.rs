//! Anthropic's Messages API as a provider: a `Conversation` written as a message request of
//! the API version the gateway sends (`upstream::ANTHROPIC_VERSION`), and its reply or stream
//! read back. (Reference: Anthropic's Messages API and streaming pages; the `anthropic` SDK's
//! types, which the request is checked against in the tests.) That version has no sampling
//! parameters (temperature, top_p, top_k): a request that sets them is refused, naming them.

use serde_json::{Map, Value, json};

use super::bad;
use super::ir::*;
use crate::error::GatewayError;

/// The effort levels of `output_config.effort` for OpenAI's `reasoning_effort`.
fn effort_of(effort: &str) -> Result<&'static str, GatewayError> {
    match effort {
        "minimal" | "low" => Ok("low"),
        "medium" => Ok("medium"),
        "high" => Ok("high"),
        "xhigh" => Ok("xhigh"),
        e => Err(bad(
            "reasoning_effort",
            format!("'{e}' is not one of none, minimal, low, medium, high, xhigh."),
        )),
    }
}

/// The smallest thinking budget Anthropic takes.
const MIN_BUDGET: u64 = 1024;

/// The request for `model`, with at most `max_tokens` of output.
pub fn write_request(
    c: &Conversation,
    model: &str,
    max_tokens: u64,
) -> Result<Vec<u8>, GatewayError> {
    let sampling = [
        ("temperature", c.temperature.is_some()),
        ("top_p", c.top_p.is_some()),
        ("top_k", c.top_k.is_some()),
    ];
    if let Some((name, _)) = sampling.iter().find(|(_, set)| *set) {
        return Err(super::unsupported(name));
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert("max_tokens".into(), json!(max_tokens));
    if !c.system.is_empty() {
        let blocks: Vec<Value> = c.system.iter().filter_map(block).collect();
        out.insert("system".into(), Value::Array(blocks));
    }
    let mut messages = Vec::with_capacity(c.messages.len());
    for m in &c.messages {
        let content = message_content(m)?;
        if content.is_empty() {
            continue;
        }
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        messages.push(json!({"role": role, "content": content}));
    }
    out.insert("messages".into(), Value::Array(messages));
    if !c.tools.is_empty() {
        let tools = c.tools.iter().map(|t| {
            let mut tool = json!({"name": t.name, "input_schema": t.schema});
            if let Some(d) = &t.description {
                tool["description"] = json!(d);
            }
            if t.cache {
                tool["cache_control"] = json!({"type": "ephemeral"});
            }
            tool
        });
        out.insert("tools".into(), Value::Array(tools.collect()));
    }
    if let Some(choice) = tool_choice(c) {
        out.insert("tool_choice".into(), choice);
    }
    if !c.stop.is_empty() {
        out.insert("stop_sequences".into(), json!(c.stop));
    }
    if c.stream {
        out.insert("stream".into(), json!(true));
    }
    let mut output_config = Map::new();
    if let Some(thinking) = thinking(c, max_tokens, &mut output_config)? {
        out.insert("thinking".into(), thinking);
    }
    if let Some(schema) = &c.json_schema {
        output_config.insert(
            "format".into(),
            json!({"type": "json_schema", "schema": schema}),
        );
    }
    if !output_config.is_empty() {
        out.insert("output_config".into(), Value::Object(output_config));
    }
    if let Some(u) = &c.user {
        out.insert("metadata".into(), json!({"user_id": u}));
    }
    Ok(Value::Object(out).to_string().into_bytes())
}

/// The thinking setting; an effort also goes into `output_config`.
fn thinking(
    c: &Conversation,
    max_tokens: u64,
    output_config: &mut Map<String, Value>,
) -> Result<Option<Value>, GatewayError> {
    let budget = match &c.reasoning {
        None => return Ok(None),
        Some(Reasoning::Off) => return Ok(Some(json!({"type": "disabled"}))),
        Some(Reasoning::Effort(e)) => {
            output_config.insert("effort".into(), json!(effort_of(e)?));
            return Ok(Some(json!({"type": "adaptive"})));
        }
        Some(Reasoning::Budget(b)) => *b,
    };
    // The budget is part of the output: below the output limit.
    let budget = budget.min(max_tokens.saturating_sub(1));
    if budget < MIN_BUDGET {
        return Err(bad(
            "max_tokens",
            format!(
                "A thinking budget needs an output limit above {MIN_BUDGET} tokens \
                 (max_tokens is {max_tokens})."
            ),
        ));
    }
    Ok(Some(json!({"type": "enabled", "budget_tokens": budget})))
}

fn tool_choice(c: &Conversation) -> Option<Value> {
    let mut choice = match c.tool_choice.as_ref()? {
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::Named(n) => json!({"type": "tool", "name": n}),
    };
    if c.parallel_tool_calls == Some(false) && choice["type"] != "none" {
        choice["disable_parallel_tool_use"] = json!(true);
    }
    Some(choice)
}

/// Marks a block as the end of a cached prefix.
fn cached(mut b: Value, cache: bool) -> Value {
    if cache {
        b["cache_control"] = json!({"type": "ephemeral"});
    }
    b
}

fn source(s: &Source) -> Value {
    match s {
        Source::Url(u) => json!({"type": "url", "url": u}),
        Source::Base64 { media_type, data } => {
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
    }
}

/// A text, image or document part as a content block (an empty text is none: the API
/// refuses empty text blocks).
fn block(p: &Part) -> Option<Value> {
    Some(match p {
        Part::Text { text, .. } if text.is_empty() => return None,
        Part::Text { text, cache } => cached(json!({"type": "text", "text": text}), *cache),
        Part::Image { source: s, cache } => {
            cached(json!({"type": "image", "source": source(s)}), *cache)
        }
        Part::Document { source: s, cache } => {
            cached(json!({"type": "document", "source": source(s)}), *cache)
        }
        _ => return None,
    })
}

fn message_content(m: &Message) -> Result<Vec<Value>, GatewayError> {
    let mut content = Vec::with_capacity(m.parts.len());
    for p in &m.parts {
        let b = match p {
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                let input: Value = if arguments.trim().is_empty() {
                    json!({})
                } else {
                    serde_json::from_str(arguments).map_err(|_| {
                        bad(
                            "messages",
                            format!("The arguments of tool call '{id}' are not JSON."),
                        )
                    })?
                };
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
            Part::ToolResult {
                id,
                content: parts,
                is_error,
            } => {
                let inner: Vec<Value> = parts.iter().filter_map(block).collect();
                let mut b = json!({"type": "tool_result", "tool_use_id": id, "content": inner});
                if *is_error {
                    b["is_error"] = json!(true);
                }
                b
            }
            // Reasoning goes back only as the provider signed it.
            Part::Thinking {
                text,
                signature: Some(s),
            } => json!({"type": "thinking", "thinking": text, "signature": s}),
            Part::Thinking { .. } => continue,
            Part::RedactedThinking { data } => json!({"type": "redacted_thinking", "data": data}),
            p => match block(p) {
                Some(b) => b,
                None => continue,
            },
        };
        content.push(b);
    }
    Ok(content)
}

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

fn text_of(v: &Value, name: &str) -> String {
    v.get(name)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// A content block of a reply.
fn reply_part(b: &Value) -> Option<Part> {
    Some(match b.get("type").and_then(Value::as_str)? {
        "text" => Part::Text {
            text: text_of(b, "text"),
            cache: false,
        },
        "thinking" => Part::Thinking {
            text: text_of(b, "thinking"),
            signature: b
                .get("signature")
                .and_then(Value::as_str)
                .map(str::to_string),
        },
        "redacted_thinking" => Part::RedactedThinking {
            data: text_of(b, "data"),
        },
        "tool_use" => Part::ToolCall {
            id: text_of(b, "id"),
            name: text_of(b, "name"),
            arguments: b.get("input").map_or_else(|| "{}".into(), Value::to_string),
        },
        _ => return None,
    })
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
