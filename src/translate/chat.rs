//! OpenAI's Chat Completions: a request read into a `Conversation`, and a reply or a stream's
//! events written as the API's own (`chat.completion`, `chat.completion.chunk`, `[DONE]`).
//! Reasoning goes out as `reasoning_content` and, with the provider's signature, as
//! `thinking_blocks` (the fields OpenAI-compatible servers use); both are read back on the
//! next turn, so multi-turn tool use with thinking works.

use serde_json::{Map, Value, json};

use super::ir::*;
use super::{bad, unsupported};
use crate::error::GatewayError;

/// Fields with no effect on the reply that a provider without them may ignore.
const IGNORED: &[&str] = &[
    "model",
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
];

/// Reads a Chat Completions request.
pub fn read_request(body: &[u8]) -> Result<Conversation, GatewayError> {
    let v: Map<String, Value> =
        serde_json::from_slice(body).map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
    let mut c = Conversation::default();
    let mut limits: Vec<u64> = Vec::new();
    for (name, value) in &v {
        if value.is_null() || IGNORED.contains(&name.as_str()) {
            continue;
        }
        match name.as_str() {
            "messages" => read_messages(value, &mut c)?,
            "tools" => c.tools = read_tools(value)?,
            "tool_choice" => c.tool_choice = Some(read_tool_choice(value)?),
            "parallel_tool_calls" => c.parallel_tool_calls = value.as_bool(),
            "max_tokens" | "max_completion_tokens" => {
                let field = if name == "max_tokens" {
                    "max_tokens"
                } else {
                    "max_completion_tokens"
                };
                limits.push(
                    value
                        .as_u64()
                        .ok_or_else(|| bad(field, format!("'{field}' must be a whole number.")))?,
                );
            }
            "temperature" => c.temperature = Some(number(value, "temperature")?),
            "top_p" => c.top_p = Some(number(value, "top_p")?),
            "top_k" => c.top_k = value.as_u64(),
            "stop" => c.stop = read_stop(value)?,
            "stream" => c.stream = value.as_bool().unwrap_or(false),
            "stream_options" => {
                c.include_usage = value
                    .get("include_usage")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
            }
            "reasoning_effort" => {
                let e = value
                    .as_str()
                    .ok_or_else(|| bad("reasoning_effort", "must be a string".into()))?;
                c.reasoning = Some(match e {
                    "none" => Reasoning::Off,
                    e => Reasoning::Effort(e.to_string()),
                });
            }
            // The form OpenAI-compatible gateways take Anthropic's thinking budget in.
            "thinking" => c.reasoning = Some(read_thinking(value)?),
            "user" | "safety_identifier" => c.user = value.as_str().map(str::to_string),
            "n" if value.as_u64() == Some(1) => {}
            "response_format" => c.json_schema = read_response_format(value)?,
            "modalities" if value == &json!(["text"]) => {}
            "logprobs" if value == &Value::Bool(false) => {}
            "presence_penalty" | "frequency_penalty" if value.as_f64() == Some(0.0) => {}
            "logit_bias" if value.as_object().is_some_and(Map::is_empty) => {}
            other => return Err(unsupported(other)),
        }
    }
    c.max_tokens = limits.into_iter().min();
    Ok(c)
}

fn number(v: &Value, field: &'static str) -> Result<f64, GatewayError> {
    v.as_f64()
        .ok_or_else(|| bad(field, format!("'{field}' must be a number.")))
}

fn read_stop(v: &Value) -> Result<Vec<String>, GatewayError> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("stop", "'stop' must be strings.".into()))
            })
            .collect(),
        _ => Err(bad("stop", "'stop' must be a string or an array.".into())),
    }
}

/// `response_format`: text (nothing asked), or a JSON schema the reply must match. JSON mode
/// without a schema has no equivalent.
fn read_response_format(v: &Value) -> Result<Option<Value>, GatewayError> {
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_schema") => v
            .get("json_schema")
            .and_then(|j| j.get("schema"))
            .cloned()
            .map(Some)
            .ok_or_else(|| {
                bad(
                    "response_format",
                    "'json_schema.schema' is required.".into(),
                )
            }),
        _ => Err(unsupported("response_format")),
    }
}

fn read_thinking(v: &Value) -> Result<Reasoning, GatewayError> {
    match v.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(Reasoning::Off),
        Some("enabled") => v
            .get("budget_tokens")
            .and_then(Value::as_u64)
            .map(Reasoning::Budget)
            .ok_or_else(|| bad("thinking", "'thinking.budget_tokens' is required.".into())),
        _ => Err(bad(
            "thinking",
            "'thinking.type' must be enabled or disabled.".into(),
        )),
    }
}

fn read_tools(v: &Value) -> Result<Vec<Tool>, GatewayError> {
    let tools = v
        .as_array()
        .ok_or_else(|| bad("tools", "'tools' must be an array.".into()))?;
    tools
        .iter()
        .map(|t| {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(GatewayError::Unsupported {
                    param: "tools",
                    message: "Only tools of type 'function' can be translated for this model."
                        .into(),
                });
            }
            let f = t
                .get("function")
                .ok_or_else(|| bad("tools", "A tool needs its 'function'.".into()))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tools", "A function needs its 'name'.".into()))?;
            Ok(Tool {
                name: name.to_string(),
                description: f
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                schema: f
                    .get("parameters")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                cache: t.get("cache_control").is_some(),
            })
        })
        .collect()
}

fn read_tool_choice(v: &Value) -> Result<ToolChoice, GatewayError> {
    match v {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad(
                "tool_choice",
                format!("'{s}' is not one of auto, none, required."),
            )),
        },
        Value::Object(o) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Named(n.to_string()))
            .ok_or_else(|| {
                bad(
                    "tool_choice",
                    "A named tool choice needs 'function.name'.".into(),
                )
            }),
        _ => Err(bad(
            "tool_choice",
            "'tool_choice' must be a string or an object.".into(),
        )),
    }
}

/// `messages`: system and developer messages become the system prompt (in order), tool
/// messages the user's tool results.
fn read_messages(v: &Value, c: &mut Conversation) -> Result<(), GatewayError> {
    let messages = v
        .as_array()
        .ok_or_else(|| bad("messages", "'messages' must be an array.".into()))?;
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        match role {
            "system" | "developer" => c.system.extend(read_content(content)?),
            "user" => push(c, Role::User, read_content(content)?),
            "assistant" => push(c, Role::Assistant, read_assistant(m)?),
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        bad("messages", "A tool message needs 'tool_call_id'.".into())
                    })?;
                let result = Part::ToolResult {
                    id: id.to_string(),
                    content: read_content(content)?,
                    is_error: false,
                };
                push(c, Role::User, vec![result]);
            }
            "function" => {
                return Err(GatewayError::Unsupported {
                    param: "messages",
                    message: "Messages of role 'function' (deprecated) cannot be translated: \
                              use tools."
                        .into(),
                });
            }
            r => return Err(bad("messages", format!("'{r}' is not a message role."))),
        }
    }
    Ok(())
}

/// Adds a message; one of the same role as the last is merged into it.
fn push(c: &mut Conversation, role: Role, parts: Vec<Part>) {
    match c.messages.last_mut() {
        Some(last) if last.role == role => last.parts.extend(parts),
        _ => c.messages.push(Message { role, parts }),
    }
}

/// A message's `content`: a string or an array of parts.
fn read_content(v: &Value) -> Result<Vec<Part>, GatewayError> {
    let cache = |p: &Value| p.get("cache_control").is_some();
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![Part::Text {
            text: s.clone(),
            cache: false,
        }]),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("text") | Some("refusal") => Ok(Part::Text {
                    text: p
                        .get("text")
                        .or_else(|| p.get("refusal"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    cache: cache(p),
                }),
                Some("image_url") => {
                    let url = p
                        .get("image_url")
                        .and_then(|i| i.get("url").or(Some(i)))
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad("messages", "An image part needs its 'url'.".into()))?;
                    Ok(Part::Image {
                        source: Source::from_url(url),
                        cache: cache(p),
                    })
                }
                Some("file") => {
                    let data = p
                        .get("file")
                        .and_then(|f| f.get("file_data"))
                        .and_then(Value::as_str);
                    match data.map(Source::from_url) {
                        Some(source @ Source::Base64 { .. }) => Ok(Part::Document {
                            source,
                            cache: cache(p),
                        }),
                        _ => Err(GatewayError::Unsupported {
                            param: "messages",
                            message: "A file part must carry its bytes ('file_data', a data \
                                      URL) for this model: uploaded file ids cannot be \
                                      translated."
                                .into(),
                        }),
                    }
                }
                Some(t) => Err(GatewayError::Unsupported {
                    param: "messages",
                    message: format!(
                        "Content parts of type '{t}' cannot be translated for this model."
                    ),
                }),
                None => Err(bad("messages", "A content part needs its 'type'.".into())),
            })
            .collect(),
        _ => Err(bad(
            "messages",
            "'content' must be a string or an array.".into(),
        )),
    }
}

/// An assistant turn: its reasoning first (as the provider wrote it), then text, then calls.
fn read_assistant(m: &Value) -> Result<Vec<Part>, GatewayError> {
    let mut parts = Vec::new();
    let blocks = m.get("thinking_blocks").and_then(Value::as_array);
    for b in blocks.into_iter().flatten() {
        match b.get("type").and_then(Value::as_str) {
            Some("thinking") => parts.push(Part::Thinking {
                text: b
                    .get("thinking")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                signature: b
                    .get("signature")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            }),
            Some("redacted_thinking") => parts.push(Part::RedactedThinking {
                data: b
                    .get("data")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            }),
            _ => {}
        }
    }
    if blocks.is_none() {
        if let Some(text) = m.get("reasoning_content").and_then(Value::as_str) {
            parts.push(Part::Thinking {
                text: text.to_string(),
                signature: None,
            });
        }
    }
    parts.extend(read_content(m.get("content").unwrap_or(&Value::Null))?);
    let calls = m.get("tool_calls").and_then(Value::as_array);
    for call in calls.into_iter().flatten() {
        let f = call.get("function").unwrap_or(&Value::Null);
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
        parts.push(Part::ToolCall {
            id: text(call.get("id")),
            name: text(f.get("name")),
            arguments: text(f.get("arguments")),
        });
    }
    if m.get("function_call").is_some_and(|f| !f.is_null()) {
        return Err(GatewayError::Unsupported {
            param: "messages",
            message: "'function_call' (deprecated) cannot be translated: use 'tool_calls'.".into(),
        });
    }
    Ok(parts)
}

fn finish_reason(stop: &Stop) -> &'static str {
    match stop {
        Stop::End | Stop::StopSequence(_) | Stop::Pause => "stop",
        Stop::MaxTokens => "length",
        Stop::ToolUse => "tool_calls",
        Stop::Refusal => "content_filter",
    }
}

/// The `usage` object: cached prompt tokens and reasoning tokens in their details.
pub fn usage(u: &Usage) -> Value {
    let mut out = json!({
        "prompt_tokens": u.prompt(),
        "completion_tokens": u.output,
        "total_tokens": u.prompt().saturating_add(u.output),
        "prompt_tokens_details": {"cached_tokens": u.cache_read},
    });
    if let Some(r) = u.reasoning {
        out["completion_tokens_details"] = json!({"reasoning_tokens": r});
    }
    out
}

fn thinking_block(text: &str, signature: Option<&str>) -> Value {
    json!({"type": "thinking", "thinking": text, "signature": signature})
}

/// A whole reply as a `chat.completion`.
pub fn write_reply(r: &Reply, created: u64) -> Vec<u8> {
    let mut text: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut blocks = Vec::new();
    let mut calls = Vec::new();
    for p in &r.parts {
        match p {
            Part::Text { text: t, .. } => text.get_or_insert_with(String::new).push_str(t),
            Part::Thinking { text: t, signature } => {
                reasoning.get_or_insert_with(String::new).push_str(t);
                blocks.push(thinking_block(t, signature.as_deref()));
            }
            Part::RedactedThinking { data } => {
                blocks.push(json!({"type": "redacted_thinking", "data": data}));
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => calls.push(json!({"id": id, "type": "function",
                                    "function": {"name": name, "arguments": arguments}})),
            _ => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": text, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    if let Some(r) = reasoning {
        message["reasoning_content"] = Value::String(r);
    }
    if !blocks.is_empty() {
        message["thinking_blocks"] = Value::Array(blocks);
    }
    let out = json!({
        "id": r.id, "object": "chat.completion", "created": created, "model": r.model,
        "choices": [{"index": 0, "message": message, "logprobs": null,
                     "finish_reason": finish_reason(&r.stop)}],
        "usage": usage(&r.usage),
    });
    out.to_string().into_bytes()
}

/// Writes a stream's events as `chat.completion.chunk`s.
#[derive(Debug)]
pub struct StreamOut {
    created: u64,
    include_usage: bool,
    id: String,
    model: String,
    /// Block index → the tool call's index in `tool_calls`.
    calls: Vec<(usize, usize)>,
    /// The reasoning of the block in progress (sent whole with its signature).
    thinking: String,
    usage: Usage,
    stop: Stop,
    done: bool,
}

impl StreamOut {
    pub fn new(created: u64, include_usage: bool) -> StreamOut {
        StreamOut {
            created,
            include_usage,
            id: String::new(),
            model: String::new(),
            calls: Vec::new(),
            thinking: String::new(),
            usage: Usage::default(),
            stop: Stop::End,
            done: false,
        }
    }

    fn chunk(&self, out: &mut Vec<u8>, delta: Value, finish: Option<&str>) {
        let c = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        super::sse::write(out, None, c.to_string().as_bytes());
    }

    fn call(&self, index: usize) -> usize {
        self.calls
            .iter()
            .find(|(i, _)| *i == index)
            .map_or(0, |(_, k)| *k)
    }

    pub fn event(&mut self, e: Event, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        match e {
            Event::Start { id, model } => {
                self.id = id;
                self.model = model;
                self.chunk(out, json!({"role": "assistant", "content": ""}), None);
            }
            Event::TextStart { .. } | Event::BlockStop { .. } => {}
            Event::ThinkingStart { .. } => self.thinking.clear(),
            Event::Text { text, .. } => self.chunk(out, json!({"content": text}), None),
            Event::Thinking { text, .. } => {
                self.thinking.push_str(&text);
                self.chunk(out, json!({"reasoning_content": text}), None);
            }
            Event::Signature { signature, .. } => {
                let block = thinking_block(&self.thinking, Some(&signature));
                self.chunk(out, json!({"thinking_blocks": [block]}), None);
            }
            Event::RedactedThinking { data, .. } => {
                let block = json!({"type": "redacted_thinking", "data": data});
                self.chunk(out, json!({"thinking_blocks": [block]}), None);
            }
            Event::ToolStart { index, id, name } => {
                let k = self.calls.len();
                self.calls.push((index, k));
                let call = json!({"index": k, "id": id, "type": "function",
                                  "function": {"name": name, "arguments": ""}});
                self.chunk(out, json!({"tool_calls": [call]}), None);
            }
            Event::ToolArguments { index, json } => {
                let call = json!({"index": self.call(index), "function": {"arguments": json}});
                self.chunk(out, json!({"tool_calls": [call]}), None);
            }
            Event::Usage(u) => self.usage = u,
            Event::Stop(s) => self.stop = s,
            Event::Error { kind, message } => {
                let e = super::errors::openai_error(&kind, &message);
                super::sse::write(out, None, e.to_string().as_bytes());
                super::sse::write(out, None, b"[DONE]");
                self.done = true;
            }
            Event::End => {
                self.chunk(out, json!({}), Some(finish_reason(&self.stop)));
                if self.include_usage {
                    let c = json!({
                        "id": self.id, "object": "chat.completion.chunk",
                        "created": self.created, "model": self.model, "choices": [],
                        "usage": usage(&self.usage),
                    });
                    super::sse::write(out, None, c.to_string().as_bytes());
                }
                super::sse::write(out, None, b"[DONE]");
                self.done = true;
            }
        }
    }
}
