//! The mock's Responses API (`/v1/responses`, plain and streamed, with stored responses to
//! retrieve, list the input of, cancel and delete); Anthropic's Messages API is routed from
//! here to `anthropic`. Words are tokens, as everywhere in the mock; the reply text is the
//! same as for chat.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};

use super::errors::{bad_request, error_reply};
use super::replies::{Reply, json_object, model_or_default, next_id, now_secs};
use super::request::{Overrides, Parsed};
use super::tokens::{count_words, reply_tokens};

/// Stored responses by id (what `store: true`, the default, keeps on a real server).
pub(super) type Stored = Mutex<HashMap<String, Value>>;

/// Most responses the mock keeps; past it, it forgets them all.
const MAX_STORED: usize = 10_000;

/// One named server-sent event: `event: <name>` then its data.
pub(super) fn named_event(name: &str, value: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {value}\n\n"))
}

/// Words of a text, of text parts, or of input items with content.
fn words(v: &Value) -> usize {
    match v {
        Value::String(s) => count_words(s),
        Value::Array(items) => items.iter().map(words).sum(),
        Value::Object(o) => o.get("text").or_else(|| o.get("content")).map_or(0, words),
        _ => 0,
    }
}

/// Answers the two APIs' paths; None for any other path.
pub(super) fn route(
    method: &Method,
    path: &str,
    parsed: &Parsed,
    ov: &Overrides,
    model: &str,
    stored: &Stored,
) -> Option<Reply> {
    let post = method == Method::POST;
    let reply = match path {
        "/v1/responses" if post => responses(parsed, ov, model, stored),
        "/v1/messages" if post => super::anthropic::messages(parsed, ov, model),
        "/v1/messages/count_tokens" if post => super::anthropic::count_tokens(parsed),
        p if p.starts_with("/v1/responses/") => stored_call(method, p, stored),
        _ => return None,
    };
    Some(reply.unwrap_or_else(|r| r))
}

/// A stored response (with its input, for `GET …/input_items`), under its id.
fn keep(stored: &Stored, id: &str, done: &Value, input: &Value) {
    let mut map = stored.lock().unwrap_or_else(|e| e.into_inner());
    if map.len() >= MAX_STORED {
        map.clear();
    }
    let mut kept = done.clone();
    if let Some(o) = kept.as_object_mut() {
        o.insert("_input".into(), input.clone());
    }
    map.insert(id.to_string(), kept);
}

/// A Responses API object as OpenAI's API returns it.
fn response_object(
    id: &str,
    status: &str,
    instructions: &Value,
    model: &str,
    output: Value,
    usage: Value,
) -> Value {
    json!({
        "id": id, "object": "response", "created_at": now_secs(), "status": status,
        "error": null, "incomplete_details": null,
        "instructions": instructions,
        "max_output_tokens": null, "model": model, "output": output,
        "parallel_tool_calls": true, "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null}, "store": true,
        "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
        "tools": [], "top_p": 1.0, "truncation": "disabled", "usage": usage,
        "user": null, "metadata": {},
    })
}

fn responses(
    parsed: &Parsed,
    ov: &Overrides,
    model: &str,
    stored: &Stored,
) -> Result<Reply, Reply> {
    let body = json_object(parsed)?;
    let input = body
        .get("input")
        .ok_or_else(|| bad_request("missing 'input'"))?;
    let prompt = (words(input) + body.get("instructions").map_or(0, words)).max(1);
    let tokens = reply_tokens(ov.chunks);
    let id = next_id("resp_mock");
    let msg_id = next_id("msg_mock");
    let model = model_or_default(model);
    let text = tokens.concat();
    let instructions = body.get("instructions").cloned().unwrap_or(Value::Null);
    let base = |status: &str, output: Value, usage: Value| {
        response_object(&id, status, &instructions, model, output, usage)
    };
    let part = |t: &str| json!({"type": "output_text", "text": t, "annotations": []});
    let item = |status: &str, content: Value| json!({"id": msg_id, "type": "message", "status": status, "role": "assistant", "content": content});
    let usage = json!({
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": tokens.len(), "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + tokens.len(),
    });
    let status = if ov.length_limited {
        "incomplete"
    } else {
        "completed"
    };
    let mut done = base(
        status,
        json!([item("completed", json!([part(&text)]))]),
        usage,
    );
    if ov.length_limited {
        done["incomplete_details"] = json!({"reason": "max_output_tokens"});
    }
    if body.get("store").and_then(Value::as_bool) != Some(false) {
        keep(stored, &id, &done, input);
    }
    if body.get("stream").and_then(Value::as_bool) != Some(true) {
        return Ok(Reply::json(200, &done));
    }
    let mut seq = 0u64;
    let mut events = Vec::with_capacity(tokens.len() + 8);
    let mut push = |name: &str, mut v: Value| {
        if let Some(o) = v.as_object_mut() {
            o.insert("type".into(), json!(name));
            o.insert("sequence_number".into(), json!(seq));
        }
        seq += 1;
        events.push(named_event(name, &v));
    };
    let started = base("in_progress", json!([]), Value::Null);
    push("response.created", json!({"response": started.clone()}));
    push("response.in_progress", json!({"response": started}));
    let at = json!({"item_id": msg_id, "output_index": 0, "content_index": 0});
    let with = |extra: Value| {
        let mut v = at.clone();
        if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        v
    };
    push(
        "response.output_item.added",
        json!({"output_index": 0, "item": item("in_progress", json!([]))}),
    );
    push(
        "response.content_part.added",
        with(json!({"part": part("")})),
    );
    for t in &tokens {
        push(
            "response.output_text.delta",
            with(json!({"delta": t, "logprobs": []})),
        );
    }
    push(
        "response.output_text.done",
        with(json!({"text": text, "logprobs": []})),
    );
    push(
        "response.content_part.done",
        with(json!({"part": part(&text)})),
    );
    push(
        "response.output_item.done",
        json!({"output_index": 0, "item": item("completed", json!([part(&text)]))}),
    );
    let last = if ov.length_limited {
        "response.incomplete"
    } else {
        "response.completed"
    };
    push(last, json!({"response": done}));
    Ok(Reply::events(events))
}

/// `/v1/responses/{id}` GET and DELETE, `/input_items` GET, `/cancel` POST.
fn stored_call(method: &Method, path: &str, stored: &Stored) -> Result<Reply, Reply> {
    let rest = path.trim_start_matches("/v1/responses/");
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let missing = || {
        error_reply(
            404,
            "invalid_request_error",
            &format!("No response found with id '{id}'."),
            "not_found",
        )
    };
    let mut map = stored.lock().unwrap_or_else(|e| e.into_inner());
    let shown = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("_input");
        }
        v
    };
    match (method.as_str(), tail) {
        ("GET", "") => map
            .get(id)
            .map(|v| Reply::json(200, &shown(v)))
            .ok_or_else(missing),
        ("DELETE", "") => map
            .remove(id)
            .map(|_| {
                Reply::json(
                    200,
                    &json!({"id": id, "object": "response", "deleted": true}),
                )
            })
            .ok_or_else(missing),
        ("GET", "input_items") => {
            let v = map.get(id).ok_or_else(missing)?;
            let input = match &v["_input"] {
                Value::String(s) => vec![json!({
                    "id": format!("in_{id}"), "type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": s}],
                })],
                Value::Array(items) => items.clone(),
                _ => Vec::new(),
            };
            Ok(Reply::json(
                200,
                &json!({"object": "list", "data": input, "first_id": null, "last_id": null, "has_more": false}),
            ))
        }
        ("POST", "cancel") => {
            let v = map.get_mut(id).ok_or_else(missing)?;
            v["status"] = json!("cancelled");
            Ok(Reply::json(200, &shown(v)))
        }
        _ => Err(error_reply(
            405,
            "invalid_request_error",
            "method not allowed",
            "method_not_allowed",
        )),
    }
}
