//! The mock's chat completions when a request offers tools or asks for reasoning: tool calls
//! (unless the last assistant turn's calls have their results; `x-mock-tool-calls: N` for N of
//! them unless `parallel_tool_calls` is false) and `reasoning_content` with its
//! `reasoning_tokens`, as OpenAI-compatible reasoning servers send them. Other chat requests
//! keep the plain path (`replies`).

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::anthropic::{THINKING, sample};
use super::replies::{Reply, model_or_default, next_id, now_secs};
use super::request::Overrides;
use super::tokens::{chat_prompt_tokens, count_words, reply_tokens};

/// A call the mock makes: (id, name, arguments as JSON text).
type Call = (String, String, String);

fn calls(body: &Map<String, Value>, ov: &Overrides) -> Vec<Call> {
    let tools: Vec<&Value> = body
        .get("tools")
        .and_then(Value::as_array)
        .map(|t| t.iter().collect())
        .unwrap_or_default();
    let choice = body.get("tool_choice").unwrap_or(&Value::Null);
    // Results of the last assistant turn's calls came back: the model answers them.
    let messages: &[Value] = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let since = messages
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .map_or(messages, |i| &messages[i..]);
    let answered = since.iter().any(|m| m["role"] == "tool");
    if tools.is_empty() || choice == "none" || answered {
        return Vec::new();
    }
    let named = choice.pointer("/function/name").and_then(Value::as_str);
    let chosen: Vec<&Value> = match named {
        Some(n) => tools
            .into_iter()
            .filter(|t| t["function"]["name"] == n)
            .collect(),
        None => tools,
    };
    let mut n = ov.tool_calls.unwrap_or(1).max(1);
    if body.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
        n = 1;
    }
    (0..n)
        .filter_map(|i| {
            let f = &chosen.get(i % chosen.len().max(1))?["function"];
            let name = f["name"].as_str().unwrap_or("tool").to_string();
            Some((
                next_id("call_mock"),
                name,
                sample(&f["parameters"]).to_string(),
            ))
        })
        .collect()
}

/// The reply to a chat request with tools or reasoning; None for any other.
pub(super) fn reply(
    body: &Map<String, Value>,
    ov: &Overrides,
    model: &str,
    stream: bool,
) -> Option<Reply> {
    let reasoning = body
        .get("reasoning_effort")
        .and_then(Value::as_str)
        .is_some_and(|e| e != "none");
    if body.get("tools").is_none() && !reasoning {
        return None;
    }
    let calls = calls(body, ov);
    let tokens = reply_tokens(if calls.is_empty() { ov.chunks } else { 3 });
    let thought = if reasoning { count_words(THINKING) } else { 0 };
    let completion =
        tokens.len() + thought + calls.iter().map(|c| count_words(&c.2)).sum::<usize>();
    let prompt = chat_prompt_tokens(body);
    let mut usage = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion});
    if reasoning {
        usage["completion_tokens_details"] = json!({"reasoning_tokens": thought});
    }
    let turn = Turn {
        id: next_id("chatcmpl-mock"),
        created: now_secs(),
        model: model_or_default(model).to_string(),
        reasoning,
        tokens,
        finish: if calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        },
        calls,
        usage,
    };
    Some(if stream {
        Reply::events(turn.events(body))
    } else {
        Reply::json(200, &turn.whole())
    })
}

struct Turn {
    id: String,
    created: u64,
    model: String,
    reasoning: bool,
    tokens: Vec<String>,
    calls: Vec<Call>,
    finish: &'static str,
    usage: Value,
}

impl Turn {
    fn tool_calls(&self) -> Vec<Value> {
        self.calls
            .iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect()
    }

    fn whole(&self) -> Value {
        let mut message = json!({"role": "assistant", "content": self.tokens.concat()});
        if self.reasoning {
            message["reasoning_content"] = json!(THINKING);
        }
        if !self.calls.is_empty() {
            message["tool_calls"] = Value::Array(self.tool_calls());
        }
        json!({"id": self.id, "object": "chat.completion", "created": self.created,
               "model": self.model,
               "choices": [{"index": 0, "message": message, "logprobs": null,
                            "finish_reason": self.finish}],
               "usage": self.usage})
    }

    fn chunk(&self, delta: Value, finish: Value) -> Bytes {
        let c = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                       "model": self.model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": null,
                                    "finish_reason": finish}]});
        Bytes::from(format!("data: {c}\n\n"))
    }

    fn events(&self, body: &Map<String, Value>) -> Vec<Bytes> {
        let mut out = vec![self.chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
        if self.reasoning {
            for w in THINKING.split_inclusive(' ') {
                out.push(self.chunk(json!({"reasoning_content": w}), Value::Null));
            }
        }
        for t in &self.tokens {
            out.push(self.chunk(json!({"content": t}), Value::Null));
        }
        for (k, (id, name, args)) in self.calls.iter().enumerate() {
            let first = json!({"index": k, "id": id, "type": "function",
                               "function": {"name": name, "arguments": ""}});
            out.push(self.chunk(json!({"tool_calls": [first]}), Value::Null));
            let cut = (0..=args.len() / 2)
                .rev()
                .find(|i| args.is_char_boundary(*i))
                .unwrap_or(0);
            for piece in [&args[..cut], &args[cut..]] {
                let more = json!({"index": k, "function": {"arguments": piece}});
                out.push(self.chunk(json!({"tool_calls": [more]}), Value::Null));
            }
        }
        out.push(self.chunk(json!({}), json!(self.finish)));
        let asked = body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            == Some(&Value::Bool(true));
        if asked {
            let u = json!({"id": self.id, "object": "chat.completion.chunk",
                           "created": self.created, "model": self.model, "choices": [],
                           "usage": self.usage});
            out.push(Bytes::from(format!("data: {u}\n\n")));
        }
        out.push(Bytes::from_static(b"data: [DONE]\n\n"));
        out
    }
}
