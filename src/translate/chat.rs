//! OpenAI's Chat Completions requests: read into a `Conversation` (from a client), and
//! written from one (for an OpenAI-speaking pool). An assistant turn's `reasoning_content` and
//! `thinking_blocks` (what `chat_reply` sends) are read back, so multi-turn tool use with
//! thinking works.

use serde_json::{Map, Value, json};

use super::ir::*;
use super::{bad, refuse};
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
            "response_format" => match read_response_format(value)? {
                Format::Text => {}
                Format::Schema(schema) => c.json_schema = Some(schema),
                Format::Json => refuse(&mut c, "response_format")?,
            },
            "modalities" if value == &json!(["text"]) => {}
            "logprobs" if value == &Value::Bool(false) => {}
            "presence_penalty" | "frequency_penalty" if value.as_f64() == Some(0.0) => {}
            "logit_bias" if value.as_object().is_some_and(Map::is_empty) => {}
            other => refuse(&mut c, other)?,
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

/// What `response_format` asks for.
enum Format {
    Text,
    /// JSON matching this schema (structured output).
    Schema(Value),
    /// JSON of any shape: no provider's equivalent.
    Json,
}

fn read_response_format(v: &Value) -> Result<Format, GatewayError> {
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(Format::Text),
        Some("json_schema") => v
            .get("json_schema")
            .and_then(|j| j.get("schema"))
            .cloned()
            .map(Format::Schema)
            .ok_or_else(|| {
                bad(
                    "response_format",
                    "'json_schema.schema' is required.".into(),
                )
            }),
        _ => Ok(Format::Json),
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
            "user" => c.push(Role::User, read_content(content)?),
            "assistant" => c.push(Role::Assistant, read_assistant(m)?),
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
                c.push(Role::User, vec![result]);
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

/// An effort for a thinking budget (OpenAI-speaking models take an effort, not a budget).
fn effort_for(budget: u64) -> &'static str {
    match budget {
        0..=2048 => "low",
        2049..=16384 => "medium",
        _ => "high",
    }
}

/// The request for `model`, with at most `max_tokens` of output when it is set. The usage of
/// a stream is always asked for: the reply's own API reports it.
pub fn write_request(
    c: &Conversation,
    model: &str,
    max_tokens: Option<u64>,
) -> Result<Vec<u8>, GatewayError> {
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert("messages".into(), Value::Array(write_messages(c)));
    if let Some(n) = max_tokens {
        out.insert("max_completion_tokens".into(), json!(n));
    }
    if !c.tools.is_empty() {
        let tools = c.tools.iter().map(|t| {
            let mut f = json!({"name": t.name, "parameters": t.schema});
            if let Some(d) = &t.description {
                f["description"] = json!(d);
            }
            json!({"type": "function", "function": f})
        });
        out.insert("tools".into(), Value::Array(tools.collect()));
        if c.parallel_tool_calls == Some(false) {
            out.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    if let Some(choice) = &c.tool_choice {
        let choice = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(n) => json!({"type": "function", "function": {"name": n}}),
        };
        out.insert("tool_choice".into(), choice);
    }
    for (name, v) in [("temperature", c.temperature), ("top_p", c.top_p)] {
        if let Some(v) = v {
            out.insert(name.into(), json!(v));
        }
    }
    if !c.stop.is_empty() {
        out.insert("stop".into(), json!(c.stop));
    }
    if c.stream {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    match &c.reasoning {
        Some(Reasoning::Effort(e)) => {
            out.insert("reasoning_effort".into(), json!(e));
        }
        Some(Reasoning::Budget(b)) => {
            out.insert("reasoning_effort".into(), json!(effort_for(*b)));
        }
        Some(Reasoning::Off) | None => {}
    }
    if let Some(schema) = &c.json_schema {
        out.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
        );
    }
    if let Some(u) = &c.user {
        out.insert("user".into(), json!(u));
    }
    Ok(Value::Object(out).to_string().into_bytes())
}

/// A text, image or document part as a content part.
fn content_part(p: &Part) -> Option<Value> {
    Some(match p {
        Part::Text { text, .. } => json!({"type": "text", "text": text}),
        Part::Image { source, .. } => {
            json!({"type": "image_url", "image_url": {"url": source.to_url()}})
        }
        Part::Document { source, .. } => {
            json!({"type": "file", "file": {"file_data": source.to_url(), "filename": "document.pdf"}})
        }
        _ => return None,
    })
}

/// Content parts as a string when they are all text (what every server takes), else parts.
fn content(parts: &[&Part]) -> Value {
    let texts: Option<Vec<&str>> = parts
        .iter()
        .map(|p| match p {
            Part::Text { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    match texts {
        Some(t) => json!(t.concat()),
        None => Value::Array(parts.iter().filter_map(|p| content_part(p)).collect()),
    }
}

/// The conversation as chat messages: the system prompt first; a user turn's tool results as
/// `tool` messages (right after the assistant's calls), then its other parts.
fn write_messages(c: &Conversation) -> Vec<Value> {
    let mut out = Vec::with_capacity(c.messages.len() + 1);
    if !c.system.is_empty() {
        let parts: Vec<&Part> = c.system.iter().collect();
        out.push(json!({"role": "system", "content": content(&parts)}));
    }
    for m in &c.messages {
        match m.role {
            Role::User => {
                for p in &m.parts {
                    if let Part::ToolResult { id, content: c, .. } = p {
                        let parts: Vec<&Part> = c.iter().collect();
                        out.push(
                            json!({"role": "tool", "tool_call_id": id, "content": content(&parts)}),
                        );
                    }
                }
                let rest: Vec<&Part> = m
                    .parts
                    .iter()
                    .filter(|p| !matches!(p, Part::ToolResult { .. }))
                    .collect();
                if !rest.is_empty() {
                    out.push(json!({"role": "user", "content": content(&rest)}));
                }
            }
            Role::Assistant => out.push(write_assistant(m)),
        }
    }
    out
}

/// An assistant turn: its text and tool calls (its reasoning is the other provider's and
/// stays out: OpenAI's API takes none back).
fn write_assistant(m: &Message) -> Value {
    let text: Vec<&Part> = m
        .parts
        .iter()
        .filter(|p| matches!(p, Part::Text { .. }))
        .collect();
    let calls: Vec<Value> = m
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall {
                id,
                name,
                arguments,
            } => Some(json!({"id": id, "type": "function",
                             "function": {"name": name, "arguments": arguments}})),
            _ => None,
        })
        .collect();
    let mut out = json!({"role": "assistant",
                         "content": if text.is_empty() { Value::Null } else { content(&text) }});
    if !calls.is_empty() {
        out["tool_calls"] = Value::Array(calls);
    }
    out
}
