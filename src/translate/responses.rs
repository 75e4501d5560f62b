//! OpenAI's Responses API requests, read into a `Conversation` (for a pool that speaks Chat
//! Completions or Anthropic's API). Input items: messages (with text, image and file parts),
//! function calls and their outputs, and reasoning items, whose `encrypted_content` carries the
//! provider's signature back (what `responses_reply` sends). A conversation kept upstream
//! (`previous_response_id`, `conversation`) has no equivalent on such a pool: 400.

use serde_json::{Map, Value};

use super::ir::*;
use super::responses_reply::{NAMESPACE_SEPARATOR, REDACTED};
use super::{bad, refuse};
use crate::error::GatewayError;

/// Fields with no effect on the reply that a provider without them may ignore (`store`: the
/// gateway keeps no response of a translated pool; `include`: encrypted reasoning is always
/// sent when the provider signs it).
const IGNORED: &[&str] = &[
    "model",
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "include",
    "truncation",
    "stream_options",
    "client_metadata",
];

/// Reads a Responses API request.
pub fn read_request(body: &[u8]) -> Result<Conversation, GatewayError> {
    let v: Map<String, Value> =
        serde_json::from_slice(body).map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
    let mut c = Conversation {
        // The API's own usage event is always sent.
        include_usage: true,
        ..Conversation::default()
    };
    for (name, value) in &v {
        if value.is_null() || IGNORED.contains(&name.as_str()) {
            continue;
        }
        match name.as_str() {
            "input" => read_input(value, &mut c)?,
            "instructions" => c.system.insert(0, text(value.as_str().unwrap_or(""))),
            "tools" => read_tools(value, &mut c)?,
            "tool_choice" => c.tool_choice = Some(read_tool_choice(value)?),
            "parallel_tool_calls" => c.parallel_tool_calls = value.as_bool(),
            "max_output_tokens" => {
                c.max_tokens = Some(value.as_u64().ok_or_else(|| {
                    bad(
                        "max_output_tokens",
                        "'max_output_tokens' must be a whole number.".into(),
                    )
                })?);
            }
            "temperature" => c.temperature = value.as_f64(),
            "top_p" => c.top_p = value.as_f64(),
            "stream" => c.stream = value.as_bool().unwrap_or(false),
            "reasoning" => {
                c.reasoning = match value.get("effort").and_then(Value::as_str) {
                    Some("none") => Some(Reasoning::Off),
                    Some(e) => Some(Reasoning::Effort(e.to_string())),
                    None => None,
                };
            }
            "text" => c.json_schema = read_text_format(value)?,
            "user" | "safety_identifier" => c.user = value.as_str().map(str::to_string),
            "previous_response_id" | "conversation" => {
                return Err(GatewayError::Unsupported {
                    param: if name == "conversation" {
                        "conversation"
                    } else {
                        "previous_response_id"
                    },
                    message: "This model's pool keeps no responses: send the whole \
                              conversation in 'input' (with store: false)."
                        .into(),
                });
            }
            "background" if value == &Value::Bool(false) => {}
            "top_logprobs" if value.as_u64() == Some(0) => {}
            other => refuse(&mut c, other)?,
        }
    }
    Ok(c)
}

fn text(t: &str) -> Part {
    Part::Text {
        text: t.to_string(),
        cache: false,
    }
}

/// `text.format`: plain text, or a JSON schema (JSON without a schema has no equivalent).
fn read_text_format(v: &Value) -> Result<Option<Value>, GatewayError> {
    let Some(format) = v.get("format") else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") | None => Ok(None),
        Some("json_schema") => format
            .get("schema")
            .cloned()
            .map(Some)
            .ok_or_else(|| bad("text", "'text.format.schema' is required.".into())),
        _ => Err(GatewayError::Unsupported {
            param: "text",
            message: "'text.format' json_object (JSON without a schema) has no equivalent for \
                      this model: give a json_schema."
                .into(),
        }),
    }
}

/// A function tool (one of a namespace's: `prefix` is `namespace__`).
fn function(t: &Value, prefix: &str, about: Option<&str>) -> Result<Tool, GatewayError> {
    let name = t
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("tools", "A function tool needs its 'name'.".into()))?;
    let own = t.get("description").and_then(Value::as_str);
    let description = match (about, own) {
        (Some(a), Some(o)) => Some(format!("{a}\n\n{o}")),
        (a, o) => o.or(a).map(str::to_string),
    };
    Ok(Tool {
        name: format!("{prefix}{name}"),
        description,
        schema: t
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
        cache: false,
    })
}

/// A free-form (`custom`) tool, for a provider that has none: a function of one string,
/// `input`, that holds the whole of what the model writes.
fn free_form(t: &Value, prefix: &str, about: Option<&str>, c: &mut Conversation) {
    let name = t.get("name").and_then(Value::as_str).unwrap_or("tool");
    let own = t.get("description").and_then(Value::as_str).unwrap_or("");
    let description = [about.unwrap_or(""), own, FREE_FORM_NOTE]
        .iter()
        .filter(|d| !d.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("\n\n");
    let full = format!("{prefix}{name}");
    c.free_form.push(full.clone());
    c.tools.push(Tool {
        name: full,
        description: Some(description),
        schema: serde_json::json!({"type": "object", "properties": {"input": {"type": "string"}},
                                   "required": ["input"]}),
        cache: false,
    });
}

/// What a free-form tool's description says of its one parameter.
const FREE_FORM_NOTE: &str = "Put the whole input of this tool, as plain text, in `input`.";

/// `tools`: functions, and the functions of namespaces (named `namespace__function` for the
/// provider, `NAMESPACE_SEPARATOR`). The tools OpenAI runs itself (web search, file search,
/// code interpreter…) are offers the provider cannot take: left out, and named in the reply's
/// `x-modelgate-tools-dropped` header.
fn read_tools(v: &Value, c: &mut Conversation) -> Result<(), GatewayError> {
    let tools = v
        .as_array()
        .ok_or_else(|| bad("tools", "'tools' must be an array.".into()))?;
    for t in tools {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "function" => c.tools.push(function(t, "", None)?),
            "namespace" => {
                let ns = t.get("name").and_then(Value::as_str).unwrap_or("");
                c.namespaces.push(ns.to_string());
                let about = t.get("description").and_then(Value::as_str);
                let inner = t.get("tools").and_then(Value::as_array);
                let prefix = format!("{ns}{NAMESPACE_SEPARATOR}");
                for f in inner.into_iter().flatten() {
                    match f.get("type").and_then(Value::as_str) {
                        Some("function") => c.tools.push(function(f, &prefix, about)?),
                        Some("custom") => free_form(f, &prefix, about, c),
                        _ => {
                            return Err(GatewayError::Unsupported {
                                param: "tools",
                                message: "Only the function and custom tools of a namespace \
                                          can be translated for this model."
                                    .into(),
                            });
                        }
                    }
                }
            }
            "custom" => free_form(t, "", None, c),
            other => c.dropped.push(other.to_string()),
        }
    }
    Ok(())
}

fn read_tool_choice(v: &Value) -> Result<ToolChoice, GatewayError> {
    match (v.as_str(), v.get("type").and_then(Value::as_str)) {
        (Some("auto"), _) => Ok(ToolChoice::Auto),
        (Some("none"), _) => Ok(ToolChoice::None),
        (Some("required"), _) => Ok(ToolChoice::Required),
        (None, Some("function")) => v
            .get("name")
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Named(n.to_string()))
            .ok_or_else(|| bad("tool_choice", "A function tool choice needs 'name'.".into())),
        _ => Err(GatewayError::Unsupported {
            param: "tool_choice",
            message: "Only auto, none, required and a named function can be translated.".into(),
        }),
    }
}

/// `input`: a string (one user message) or items.
fn read_input(v: &Value, c: &mut Conversation) -> Result<(), GatewayError> {
    let items = match v {
        Value::String(s) => {
            c.push(Role::User, vec![text(s)]);
            return Ok(());
        }
        Value::Array(items) => items,
        _ => return Err(bad("input", "'input' must be a string or an array.".into())),
    };
    for item in items {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => read_message(item, c)?,
            "function_call" => {
                let s = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                let name = match item.get("namespace").and_then(Value::as_str) {
                    Some(ns) => format!("{ns}{NAMESPACE_SEPARATOR}{}", s("name")),
                    None => s("name"),
                };
                let call = Part::ToolCall {
                    id: s("call_id"),
                    name,
                    arguments: s("arguments"),
                };
                c.push(Role::Assistant, vec![call]);
            }
            "additional_tools" => {
                if let Some(t) = item.get("tools") {
                    read_tools(t, c)?;
                }
            }
            "custom_tool_call" => {
                let s = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("");
                let name = match item.get("namespace").and_then(Value::as_str) {
                    Some(ns) => format!("{ns}{NAMESPACE_SEPARATOR}{}", s("name")),
                    None => s("name").to_string(),
                };
                let call = Part::ToolCall {
                    id: s("call_id").to_string(),
                    name,
                    arguments: serde_json::json!({"input": s("input")}).to_string(),
                };
                c.push(Role::Assistant, vec![call]);
            }
            "function_call_output" | "custom_tool_call_output" => {
                let output = item.get("output").unwrap_or(&Value::Null);
                let content = match output {
                    Value::String(s) => vec![text(s)],
                    other => read_content(other)?,
                };
                let result = Part::ToolResult {
                    id: item
                        .get("call_id")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    content,
                    is_error: false,
                };
                c.push(Role::User, vec![result]);
            }
            "reasoning" => {
                let summary: String = item
                    .get("summary")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.get("text").and_then(Value::as_str))
                    .collect();
                let encrypted = item.get("encrypted_content").and_then(Value::as_str);
                let thinking = match encrypted.and_then(|e| e.strip_prefix(REDACTED)) {
                    Some(data) => Part::RedactedThinking {
                        data: data.to_string(),
                    },
                    None => Part::Thinking {
                        text: summary,
                        signature: encrypted.map(str::to_string),
                    },
                };
                c.push(Role::Assistant, vec![thinking]);
            }
            other => {
                return Err(GatewayError::Unsupported {
                    param: "input",
                    message: format!(
                        "Input items of type '{other}' cannot be translated for this model."
                    ),
                });
            }
        }
    }
    Ok(())
}

fn read_message(item: &Value, c: &mut Conversation) -> Result<(), GatewayError> {
    let parts = read_content(item.get("content").unwrap_or(&Value::Null))?;
    match item.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => c.system.extend(parts),
        Some("assistant") => c.push(Role::Assistant, parts),
        Some("user") => c.push(Role::User, parts),
        _ => {
            return Err(bad(
                "input",
                "A message's role must be user, assistant, system or developer.".into(),
            ));
        }
    }
    Ok(())
}

/// A message's content: a string or parts.
fn read_content(v: &Value) -> Result<Vec<Part>, GatewayError> {
    let parts = match v {
        Value::Null => return Ok(Vec::new()),
        Value::String(s) => return Ok(vec![text(s)]),
        Value::Array(p) => p,
        _ => {
            return Err(bad(
                "input",
                "'content' must be a string or an array.".into(),
            ));
        }
    };
    parts
        .iter()
        .map(|p| {
            let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
            let field = |k: &str| p.get(k).and_then(Value::as_str);
            match kind {
                "input_text" | "output_text" | "text" => Ok(text(field("text").unwrap_or(""))),
                "refusal" => Ok(text(field("refusal").unwrap_or(""))),
                "input_image" => match field("image_url") {
                    Some(url) => Ok(Part::Image {
                        source: Source::from_url(url),
                        cache: false,
                    }),
                    None => Err(file_by_id()),
                },
                "input_file" => match field("file_data").map(Source::from_url) {
                    Some(source @ Source::Base64 { .. }) => Ok(Part::Document {
                        source,
                        cache: false,
                    }),
                    _ => match field("file_url") {
                        Some(url) => Ok(Part::Document {
                            source: Source::Url(url.to_string()),
                            cache: false,
                        }),
                        None => Err(file_by_id()),
                    },
                },
                other => Err(GatewayError::Unsupported {
                    param: "input",
                    message: format!(
                        "Content parts of type '{other}' cannot be translated for this model."
                    ),
                }),
            }
        })
        .collect()
}

fn file_by_id() -> GatewayError {
    GatewayError::Unsupported {
        param: "input",
        message: "Files by id live at OpenAI: send the bytes (a data URL) or a URL for this \
                  model."
            .into(),
    }
}
