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

/// Fields with no effect on the reply that a provider without them may ignore (Claude Code
/// sends `context_management`, Anthropic's trimming of old tool results: a pool without it
/// gets the whole context).
const IGNORED: &[&str] = &[
    "model",
    "service_tier",
    "cache_control",
    "inference_geo",
    "context_management",
];

/// Reads a Messages API request.
pub fn read_request(body: &[u8]) -> Result<Conversation, GatewayError> {
    let v: Map<String, Value> =
        serde_json::from_slice(body).map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
    let mut c = Conversation::default();
    for (name, value) in &v {
        if value.is_null() || IGNORED.contains(&name.as_str()) {
            continue;
        }
        match name.as_str() {
            "max_tokens" => c.max_tokens = value.as_u64(),
            "system" => c.system = read_blocks(value)?,
            "messages" => read_messages(value, &mut c)?,
            "tools" => read_tools(value, &mut c)?,
            "tool_choice" => read_tool_choice(value, &mut c)?,
            "stop_sequences" => {
                c.stop = serde_json::from_value(value.clone())
                    .map_err(|_| bad("stop_sequences", "must be an array of strings".into()))?;
            }
            "stream" => c.stream = value.as_bool().unwrap_or(false),
            "temperature" => c.temperature = value.as_f64(),
            "top_p" => c.top_p = value.as_f64(),
            "top_k" => c.top_k = value.as_u64(),
            "thinking" => c.reasoning = read_thinking(value),
            "output_config" => read_output_config(value, &mut c)?,
            "metadata" => {
                c.user = value
                    .get("user_id")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            other => super::refuse(&mut c, other)?,
        }
    }
    Ok(c)
}

fn read_thinking(v: &Value) -> Option<Reasoning> {
    match v.get("type").and_then(Value::as_str)? {
        "enabled" => Some(Reasoning::Budget(
            v.get("budget_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(MIN_BUDGET),
        )),
        "disabled" => Some(Reasoning::Off),
        // Adaptive: the model decides; `output_config.effort` may say how hard.
        _ => Some(Reasoning::Effort("medium".into())),
    }
}

fn read_output_config(v: &Value, c: &mut Conversation) -> Result<(), GatewayError> {
    if let Some(e) = v.get("effort").and_then(Value::as_str) {
        let effort = match e {
            "max" => "xhigh",
            e => e,
        };
        c.reasoning = Some(Reasoning::Effort(effort.to_string()));
    }
    if let Some(f) = v.get("format").filter(|f| !f.is_null()) {
        c.json_schema = Some(
            f.get("schema")
                .cloned()
                .ok_or_else(|| bad("output_config", "'format.schema' is required.".into()))?,
        );
    }
    Ok(())
}

/// `tools`: the client's own (with an input schema). The tools Anthropic runs itself (web
/// search, code execution…: a versioned `type`) are offers the provider cannot take: left
/// out, and named in the reply's `x-modelgate-tools-dropped` header.
fn read_tools(v: &Value, c: &mut Conversation) -> Result<(), GatewayError> {
    let tools = v
        .as_array()
        .ok_or_else(|| bad("tools", "'tools' must be an array.".into()))?;
    for t in tools {
        let custom = t.get("type").is_none_or(|k| k == "custom");
        let name = t.get("name").and_then(Value::as_str);
        let (Some(name), Some(schema), true) = (name, t.get("input_schema"), custom) else {
            let kind = t.get("type").and_then(Value::as_str);
            c.dropped.push(kind.or(name).unwrap_or("tool").to_string());
            continue;
        };
        c.tools.push(Tool {
            name: name.to_string(),
            description: t
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            schema: schema.clone(),
            cache: t.get("cache_control").is_some(),
        });
    }
    Ok(())
}

fn read_tool_choice(v: &Value, c: &mut Conversation) -> Result<(), GatewayError> {
    c.tool_choice = Some(match v.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => ToolChoice::Named(
            v.get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad(
                        "tool_choice",
                        "A tool choice of type tool needs 'name'.".into(),
                    )
                })?
                .to_string(),
        ),
        _ => {
            return Err(bad(
                "tool_choice",
                "'tool_choice.type' must be auto, any, tool or none.".into(),
            ));
        }
    });
    if v.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
        c.parallel_tool_calls = Some(false);
    }
    Ok(())
}

fn read_messages(v: &Value, c: &mut Conversation) -> Result<(), GatewayError> {
    let messages = v
        .as_array()
        .ok_or_else(|| bad("messages", "'messages' must be an array.".into()))?;
    for m in messages {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            // Newer API versions take system turns among the messages.
            Some("system") => {
                c.system
                    .extend(read_blocks(m.get("content").unwrap_or(&Value::Null))?);
                continue;
            }
            _ => {
                return Err(bad(
                    "messages",
                    "A message's role must be user or assistant.".into(),
                ));
            }
        };
        let parts = read_blocks(m.get("content").unwrap_or(&Value::Null))?;
        c.messages.push(Message { role, parts });
    }
    Ok(())
}

fn read_source(s: &Value) -> Result<Source, GatewayError> {
    match s.get("type").and_then(Value::as_str) {
        Some("base64") => Ok(Source::Base64 {
            media_type: text_of(s, "media_type"),
            data: text_of(s, "data"),
        }),
        Some("url") => Ok(Source::Url(text_of(s, "url"))),
        _ => Err(GatewayError::Unsupported {
            param: "messages",
            message: "Only base64 and url sources can be translated for this model.".into(),
        }),
    }
}

/// Content: a string, or blocks.
fn read_blocks(v: &Value) -> Result<Vec<Part>, GatewayError> {
    let blocks = match v {
        Value::Null => return Ok(Vec::new()),
        Value::String(s) => {
            return Ok(vec![Part::Text {
                text: s.clone(),
                cache: false,
            }]);
        }
        Value::Array(b) => b,
        _ => {
            return Err(bad(
                "messages",
                "'content' must be a string or an array.".into(),
            ));
        }
    };
    blocks.iter().map(read_block).collect()
}

pub(super) fn read_block(b: &Value) -> Result<Part, GatewayError> {
    let cache = b.get("cache_control").is_some_and(|c| !c.is_null());
    let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
    Ok(match kind {
        "text" => Part::Text {
            text: text_of(b, "text"),
            cache,
        },
        "image" => Part::Image {
            source: read_source(b.get("source").unwrap_or(&Value::Null))?,
            cache,
        },
        "document" => Part::Document {
            source: read_source(b.get("source").unwrap_or(&Value::Null))?,
            cache,
        },
        "tool_use" => Part::ToolCall {
            id: text_of(b, "id"),
            name: text_of(b, "name"),
            arguments: b.get("input").map_or_else(|| "{}".into(), Value::to_string),
        },
        "tool_result" => Part::ToolResult {
            id: text_of(b, "tool_use_id"),
            content: read_blocks(b.get("content").unwrap_or(&Value::Null))?,
            is_error: b.get("is_error") == Some(&Value::Bool(true)),
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
        other => {
            return Err(GatewayError::Unsupported {
                param: "messages",
                message: format!(
                    "Content blocks of type '{other}' cannot be translated for this model."
                ),
            });
        }
    })
}

pub(super) fn text_of(v: &Value, name: &str) -> String {
    v.get(name)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}
