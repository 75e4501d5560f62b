//! Responses API replies: a reply or a stream's events written as the API's own (`response`,
//! `response.created` … `response.completed`, every event with its `sequence_number`). Text is
//! a `message` item, each tool call a `function_call` item, reasoning a `reasoning` item whose
//! summary is the provider's reasoning text and whose `encrypted_content` carries its
//! signature (read back by `responses`, so multi-turn tool use with thinking works).

use std::sync::Arc;

use serde_json::{Value, json};

use super::ir::*;

/// Joins a namespace and one of its functions into the name the provider sees.
pub const NAMESPACE_SEPARATOR: &str = "__";

/// Marks a reasoning item that carries a provider's redacted (encrypted) thinking rather than
/// the signature of a readable one.
pub const REDACTED: &str = "redacted:";

/// The `usage` object.
fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt(),
        "input_tokens_details": {"cached_tokens": u.cache_read, "cache_write_tokens": u.cache_write},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning.unwrap_or(0)},
        "total_tokens": u.prompt().saturating_add(u.output),
    })
}

/// The ids of a response's items, from the provider's reply id.
#[derive(Debug, Default, Clone)]
struct Ids(String, Arc<ToolNames>);

/// What the request said of its tools that the reply's items need: its namespaces, and its
/// free-form tools (by the name the provider saw).
#[derive(Debug, Default)]
pub struct ToolNames {
    pub namespaces: Vec<String>,
    pub free_form: Vec<String>,
}

impl Ids {
    fn response(&self) -> String {
        format!("resp_{}", self.0)
    }

    fn item(&self, prefix: &str, index: usize) -> String {
        format!("{prefix}_{}_{index}", self.0)
    }
}

fn message(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn reasoning(id: &str, text: &str, encrypted: Option<String>) -> Value {
    let summary: Vec<Value> = if text.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "summary_text", "text": text})]
    };
    let mut item = json!({"type": "reasoning", "id": id, "summary": summary});
    if let Some(e) = encrypted {
        item["encrypted_content"] = json!(e);
    }
    item
}

/// A function call item; a name `namespace__function` of a namespace the request named is
/// split back into the two.
fn call(ids: &Ids, id: &str, call_id: &str, name: &str, args: &str, status: &str) -> Value {
    let mut item = if ids.1.free_form.iter().any(|f| f == name) {
        // A free-form tool's input is the one string the provider's call carries.
        let input = serde_json::from_str::<Value>(args)
            .ok()
            .and_then(|v| v.get("input").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_default();
        json!({"type": "custom_tool_call", "id": id, "call_id": call_id, "name": name,
               "input": input, "status": status})
    } else {
        json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
               "arguments": args, "status": status})
    };
    let split = name.split_once(NAMESPACE_SEPARATOR);
    if let Some((ns, f)) = split.filter(|(ns, _)| ids.1.namespaces.iter().any(|n| n == ns)) {
        item["namespace"] = json!(ns);
        item["name"] = json!(f);
    }
    item
}

/// A part of a reply as an output item.
fn item(p: &Part, ids: &Ids, index: usize) -> Option<Value> {
    Some(match p {
        Part::Text { text, .. } => message(&ids.item("msg", index), text, "completed"),
        Part::Thinking { text, signature } => {
            reasoning(&ids.item("rs", index), text, signature.clone())
        }
        Part::RedactedThinking { data } => reasoning(
            &ids.item("rs", index),
            "",
            Some(format!("{REDACTED}{data}")),
        ),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => call(
            ids,
            &ids.item("fc", index),
            id,
            name,
            arguments,
            "completed",
        ),
        _ => return None,
    })
}

/// The response object; `output` and `usage` once known.
fn response(
    ids: &Ids,
    model: &str,
    created: u64,
    output: Vec<Value>,
    end: Option<(&Stop, &Usage)>,
) -> Value {
    let (status, incomplete) = match end {
        None => ("in_progress", Value::Null),
        Some((Stop::MaxTokens, _)) => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some((Stop::Refusal, _)) => ("incomplete", json!({"reason": "content_filter"})),
        Some(_) => ("completed", Value::Null),
    };
    json!({
        "id": ids.response(), "object": "response", "created_at": created, "status": status,
        "model": model, "output": output, "error": null, "incomplete_details": incomplete,
        "instructions": null, "metadata": {}, "parallel_tool_calls": true,
        "temperature": null, "top_p": null, "tool_choice": "auto", "tools": [],
        "usage": end.map(|(_, u)| usage(u)),
    })
}

/// A whole reply as a `response`.
pub fn write_reply(r: &Reply, created: u64, namespaces: &Arc<ToolNames>) -> Vec<u8> {
    let ids = Ids(r.id.clone(), namespaces.clone());
    let output = r
        .parts
        .iter()
        .enumerate()
        .filter_map(|(i, p)| item(p, &ids, i))
        .collect();
    response(&ids, &r.model, created, output, Some((&r.stop, &r.usage)))
        .to_string()
        .into_bytes()
}

/// An output item being streamed.
#[derive(Debug)]
struct Open {
    /// The provider's block index.
    block: usize,
    output_index: usize,
    id: String,
    kind: Kind,
    /// Its text, reasoning or arguments so far.
    text: String,
}

#[derive(Debug)]
enum Kind {
    Text,
    Thinking { signature: Option<String> },
    Redacted(String),
    Call { call_id: String, name: String },
}

/// Writes a stream's events as the Responses API's.
#[derive(Debug, Default)]
pub struct StreamOut {
    created: u64,
    /// The request's tool namespaces.
    namespaces: Arc<ToolNames>,
    ids: Ids,
    model: String,
    seq: u64,
    open: Vec<Open>,
    /// The items done, by output index.
    output: Vec<Value>,
    usage: Usage,
    stop: Stop,
    done: bool,
}

impl StreamOut {
    pub fn new(created: u64, namespaces: Arc<ToolNames>) -> StreamOut {
        StreamOut {
            created,
            namespaces,
            ..StreamOut::default()
        }
    }

    fn send(&mut self, out: &mut Vec<u8>, name: &str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        super::sse::write(out, Some(name), data.to_string().as_bytes());
    }

    /// Opens an output item for block `block`; its output index and id.
    fn open(&mut self, block: usize, prefix: &str, kind: Kind) -> (usize, String) {
        let output_index = self.output.len();
        let id = self.ids.item(prefix, output_index);
        self.output.push(Value::Null);
        self.open.push(Open {
            block,
            output_index,
            id: id.clone(),
            kind,
            text: String::new(),
        });
        (output_index, id)
    }

    fn find(&mut self, block: usize) -> Option<&mut Open> {
        self.open.iter_mut().find(|o| o.block == block)
    }

    pub fn event(&mut self, e: Event, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        match e {
            Event::Start { id, model } => {
                self.ids = Ids(id, self.namespaces.clone());
                self.model = model;
                let r = response(&self.ids, &self.model, self.created, Vec::new(), None);
                self.send(out, "response.created", json!({"response": r}));
                let r = response(&self.ids, &self.model, self.created, Vec::new(), None);
                self.send(out, "response.in_progress", json!({"response": r}));
            }
            Event::TextStart { index } => {
                let (at, id) = self.open(index, "msg", Kind::Text);
                let mut item = message(&id, "", "in_progress");
                item["content"] = json!([]);
                self.send(
                    out,
                    "response.output_item.added",
                    json!({"output_index": at, "item": item}),
                );
                let part = json!({"type": "output_text", "text": "", "annotations": []});
                self.send(
                    out,
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": at, "content_index": 0, "part": part}),
                );
            }
            Event::ThinkingStart { index } => {
                let (at, id) = self.open(index, "rs", Kind::Thinking { signature: None });
                let item = reasoning(&id, "", None);
                self.send(
                    out,
                    "response.output_item.added",
                    json!({"output_index": at, "item": item}),
                );
                let part = json!({"type": "summary_text", "text": ""});
                self.send(
                    out,
                    "response.reasoning_summary_part.added",
                    json!({"item_id": id, "output_index": at, "summary_index": 0, "part": part}),
                );
            }
            Event::RedactedThinking { index, data } => {
                let (at, id) = self.open(index, "rs", Kind::Redacted(data));
                let item = reasoning(&id, "", None);
                self.send(
                    out,
                    "response.output_item.added",
                    json!({"output_index": at, "item": item}),
                );
            }
            Event::ToolStart { index, id, name } => {
                let kind = Kind::Call {
                    call_id: id.clone(),
                    name: name.clone(),
                };
                let (at, item_id) = self.open(index, "fc", kind);
                let item = call(&self.ids, &item_id, &id, &name, "", "in_progress");
                self.send(
                    out,
                    "response.output_item.added",
                    json!({"output_index": at, "item": item}),
                );
            }
            Event::Text { index, text }
            | Event::Thinking { index, text }
            | Event::ToolArguments { index, json: text } => {
                self.delta(index, text, out);
            }
            Event::Signature { index, signature } => {
                if let Some(Open {
                    kind: Kind::Thinking { signature: s },
                    ..
                }) = self.find(index)
                {
                    *s = Some(signature);
                }
            }
            Event::BlockStop { index } => self.close(index, out),
            Event::Usage(u) => self.usage = u,
            Event::Stop(s) => self.stop = s,
            Event::Error { kind, message } => {
                self.send(
                    out,
                    "error",
                    json!({"code": kind, "message": message, "param": null}),
                );
                self.done = true;
            }
            Event::End => self.end(out),
        }
    }

    fn delta(&mut self, block: usize, delta: String, out: &mut Vec<u8>) {
        let names = self.ids.1.clone();
        let Some(o) = self.find(block) else { return };
        o.text.push_str(&delta);
        let (id, at) = (o.id.clone(), o.output_index);
        let (name, data) = match o.kind {
            Kind::Text => (
                "response.output_text.delta",
                json!({"item_id": id, "output_index": at, "content_index": 0, "delta": delta, "logprobs": []}),
            ),
            Kind::Thinking { .. } => (
                "response.reasoning_summary_text.delta",
                json!({"item_id": id, "output_index": at, "summary_index": 0, "delta": delta}),
            ),
            // A free-form call's input is inside the provider's JSON: sent whole at its end.
            Kind::Call { ref name, .. } if names.free_form.contains(name) => return,
            Kind::Call { .. } => (
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": at, "delta": delta}),
            ),
            Kind::Redacted(_) => return,
        };
        self.send(out, name, data);
    }

    /// Ends the output item of `block`: its done events, and the item kept for the response.
    fn close(&mut self, block: usize, out: &mut Vec<u8>) {
        let Some(pos) = self.open.iter().position(|o| o.block == block) else {
            return;
        };
        let o = self.open.remove(pos);
        let (id, at) = (o.id.as_str(), o.output_index);
        let item = match o.kind {
            Kind::Text => {
                let part = json!({"type": "output_text", "text": o.text, "annotations": []});
                self.send(out, "response.output_text.done", json!({"item_id": id, "output_index": at, "content_index": 0, "text": o.text, "logprobs": []}));
                self.send(
                    out,
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": at, "content_index": 0, "part": part}),
                );
                message(id, &o.text, "completed")
            }
            Kind::Thinking { signature } => {
                let part = json!({"type": "summary_text", "text": o.text});
                self.send(
                    out,
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": at, "summary_index": 0, "text": o.text}),
                );
                self.send(
                    out,
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": at, "summary_index": 0, "part": part}),
                );
                reasoning(id, &o.text, signature)
            }
            Kind::Redacted(data) => reasoning(id, "", Some(format!("{REDACTED}{data}"))),
            Kind::Call { call_id, name } => {
                let item = call(&self.ids, id, &call_id, &name, &o.text, "completed");
                let done = match item["type"].as_str() {
                    Some("custom_tool_call") => (
                        "response.custom_tool_call_input.done",
                        json!({"item_id": id, "output_index": at, "input": item["input"]}),
                    ),
                    _ => (
                        "response.function_call_arguments.done",
                        json!({"item_id": id, "output_index": at, "arguments": o.text}),
                    ),
                };
                self.send(out, done.0, done.1);
                item
            }
        };
        self.send(
            out,
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        );
        if let Some(slot) = self.output.get_mut(at) {
            *slot = item;
        }
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        let blocks: Vec<usize> = self.open.iter().map(|o| o.block).collect();
        for b in blocks {
            self.close(b, out);
        }
        let output: Vec<Value> = self
            .output
            .iter()
            .filter(|i| !i.is_null())
            .cloned()
            .collect();
        let r = response(
            &self.ids,
            &self.model,
            self.created,
            output,
            Some((&self.stop, &self.usage)),
        );
        let name = if r["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.send(out, name, json!({"response": r}));
        self.done = true;
    }
}
