//! Chat Completions replies: a reply or a stream's events written as the API's own
//! (`chat.completion`, `chat.completion.chunk`, `[DONE]`), and an OpenAI-speaking pool's reply
//! or stream read back. Reasoning goes out as `reasoning_content` and, with the provider's
//! signature, as `thinking_blocks` (the fields OpenAI-compatible servers use).

use serde_json::{Value, json};

use super::ir::*;

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
        "prompt_tokens_details": {"cached_tokens": u.cache_read, "cache_write_tokens": u.cache_write},
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

fn stop_of(finish: &str) -> Stop {
    match finish {
        "length" => Stop::MaxTokens,
        "tool_calls" | "function_call" => Stop::ToolUse,
        "content_filter" => Stop::Refusal,
        _ => Stop::End,
    }
}

/// A chat `usage` as neutral counts: the cached and cache-write tokens apart from the rest of
/// the prompt (which counts them all).
fn read_usage(u: &Value) -> Usage {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64);
    let prompt = n(u.get("prompt_tokens")).unwrap_or(0);
    let cached = n(u.pointer("/prompt_tokens_details/cached_tokens"))
        .unwrap_or(0)
        .min(prompt);
    let written = n(u.pointer("/prompt_tokens_details/cache_write_tokens"))
        .unwrap_or(0)
        .min(prompt - cached);
    Usage {
        input: prompt - cached - written,
        output: n(u.get("completion_tokens")).unwrap_or(0),
        cache_read: cached,
        cache_write: written,
        reasoning: n(u.pointer("/completion_tokens_details/reasoning_tokens")),
    }
}

fn text_at(v: &Value, name: &str) -> String {
    v.get(name)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// The reasoning text of a message or delta (`reasoning_content`, or vLLM's `reasoning`).
fn reasoning_of(m: &Value) -> Option<&str> {
    m.get("reasoning_content")
        .or_else(|| m.get("reasoning"))
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
}

/// Reads a whole `chat.completion` (None: not one).
pub fn read_reply(body: &[u8]) -> Option<Reply> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let choice = v.get("choices")?.get(0)?;
    let m = choice.get("message")?;
    let mut parts = Vec::new();
    if let Some(r) = reasoning_of(m) {
        parts.push(Part::Thinking {
            text: r.to_string(),
            signature: None,
        });
    }
    let text = m
        .get("content")
        .and_then(Value::as_str)
        .or_else(|| m.get("refusal").and_then(Value::as_str))
        .filter(|t| !t.is_empty());
    if let Some(t) = text {
        parts.push(Part::Text {
            text: t.to_string(),
            cache: false,
        });
    }
    for call in m
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let f = call.get("function").unwrap_or(&Value::Null);
        parts.push(Part::ToolCall {
            id: text_at(call, "id"),
            name: text_at(f, "name"),
            arguments: text_at(f, "arguments"),
        });
    }
    Some(Reply {
        id: text_at(&v, "id"),
        model: text_at(&v, "model"),
        parts,
        stop: stop_of(
            choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .unwrap_or(""),
        ),
        usage: v.get("usage").map(read_usage).unwrap_or_default(),
    })
}

/// What block a chat stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Text,
    Thinking,
    /// A tool call, by its index in `tool_calls`.
    Tool(u64),
}

/// Reads a chat stream's chunks as events: blocks opened and closed as the deltas change
/// kind (reasoning, text, each tool call), numbered in order.
#[derive(Debug)]
pub struct StreamIn {
    started: bool,
    open: Open,
    /// The next block's index.
    next: usize,
    /// Tool call index → its block.
    calls: Vec<(u64, usize)>,
    ended: bool,
}

impl Default for StreamIn {
    fn default() -> Self {
        StreamIn {
            started: false,
            open: Open::None,
            next: 0,
            calls: Vec::new(),
            ended: false,
        }
    }
}

impl StreamIn {
    fn close(&mut self, out: &mut Vec<Event>) {
        if self.open != Open::None {
            out.push(Event::BlockStop {
                index: self.next - 1,
            });
            self.open = Open::None;
        }
    }

    /// Opens a block of `kind` unless it is the one open; its index.
    fn enter(&mut self, kind: Open, out: &mut Vec<Event>) -> Option<usize> {
        if self.open == kind {
            return None;
        }
        self.close(out);
        self.open = kind;
        self.next += 1;
        Some(self.next - 1)
    }

    /// One event's data.
    pub fn event(&mut self, data: &[u8], out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        if data == b"[DONE]" {
            self.close(out);
            out.push(Event::End);
            self.ended = true;
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        if let Some(e) = v.get("error") {
            out.push(Event::Error {
                kind: e
                    .get("code")
                    .and_then(Value::as_str)
                    .or_else(|| e.get("type").and_then(Value::as_str))
                    .unwrap_or("api_error")
                    .to_string(),
                message: text_at(e, "message"),
            });
            self.ended = true;
            return;
        }
        if !self.started {
            self.started = true;
            out.push(Event::Start {
                id: text_at(&v, "id"),
                model: text_at(&v, "model"),
            });
        }
        let choice = v.get("choices").and_then(|c| c.get(0));
        if let Some(d) = choice.and_then(|c| c.get("delta")) {
            self.delta(d, out);
        }
        let finish = choice
            .and_then(|c| c.get("finish_reason"))
            .and_then(Value::as_str);
        if let Some(f) = finish {
            self.close(out);
            out.push(Event::Stop(stop_of(f)));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            out.push(Event::Usage(read_usage(u)));
        }
    }

    fn delta(&mut self, d: &Value, out: &mut Vec<Event>) {
        if let Some(r) = reasoning_of(d) {
            if let Some(index) = self.enter(Open::Thinking, out) {
                out.push(Event::ThinkingStart { index });
            }
            out.push(Event::Thinking {
                index: self.next - 1,
                text: r.to_string(),
            });
        }
        if let Some(t) = d
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            if let Some(index) = self.enter(Open::Text, out) {
                out.push(Event::TextStart { index });
            }
            out.push(Event::Text {
                index: self.next - 1,
                text: t.to_string(),
            });
        }
        for call in d
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let k = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let f = call.get("function").unwrap_or(&Value::Null);
            let index = match self.calls.iter().find(|(c, _)| *c == k) {
                Some((_, i)) => *i,
                None => {
                    let Some(index) = self.enter(Open::Tool(k), out) else {
                        continue;
                    };
                    self.calls.push((k, index));
                    out.push(Event::ToolStart {
                        index,
                        id: text_at(call, "id"),
                        name: text_at(f, "name"),
                    });
                    index
                }
            };
            let args = f
                .get("arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty());
            if let Some(a) = args {
                out.push(Event::ToolArguments {
                    index,
                    json: a.to_string(),
                });
            }
        }
    }
}
