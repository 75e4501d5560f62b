//! The translation's own vectors: requests from OpenAI's Chat Completions reference, streams
//! from Anthropic's streaming reference ("Streaming request with tool use", its events
//! abridged to the fields the API documents).

use serde_json::{Value, json};

use super::*;

/// A chat request translated for an Anthropic pool (its model there `claude-up`).
fn translated(body: &Value) -> Result<(Bytes, Translation), GatewayError> {
    translated_dropping(body, &[])
}

/// The same for a pool whose `drop_params` are `drop`.
fn translated_dropping(
    body: &Value,
    drop: &[String],
) -> Result<(Bytes, Translation), GatewayError> {
    let body = body.to_string();
    let a = Asked {
        body: body.as_bytes(),
        model: "claude-up",
        cap: None,
        default_max_tokens: 4096,
        drop,
    };
    let plan = Plan {
        from: Api::Chat,
        to: Api::Messages,
    };
    request(plan, &a)
}

fn asked(body: &Value) -> (Value, Translation) {
    let (out, t) = translated(body).expect("translated");
    (serde_json::from_slice(&out).expect("json"), t)
}

#[test]
fn a_chat_conversation_with_tools_becomes_a_message_request() {
    let (m, _) = asked(&json!({
        "model": "claude-x", "max_completion_tokens": 300, "stream": true,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        ],
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "w"}},
    }));
    assert_eq!(
        m,
        json!({
            "model": "claude-up", "max_tokens": 300, "stream": true,
            "system": [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Use tools."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_1", "name": "w", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "call_2", "name": "w", "input": {"city": "Rome"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "rain"}]}]},
            ],
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "w"},
        })
    );
}

#[test]
fn what_has_no_equivalent_is_refused_by_name_and_nothing_is_dropped() {
    let refuse = |extra: Value| {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        translated(&body).err().map(|e| e.parts())
    };
    for (extra, param) in [
        (json!({"temperature": 0.3}), "temperature"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"n": 3}), "n"),
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"frobnicate": 1}), "body"),
    ] {
        let p = refuse(extra.clone()).expect("refused");
        assert_eq!((p.status, p.param), (400, Some(param)), "{extra}");
    }
    // Neutral values and fields with no effect on the reply pass.
    assert!(
        refuse(json!({"n": 1, "logprobs": false, "store": true, "presence_penalty": 0})).is_none()
    );
}

#[test]
fn a_pools_drop_params_are_left_out_and_named_to_the_client() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0, "top_p": 0.5, "response_format": {"type": "json_object"}});
    let drop: Vec<String> = ["temperature", "top_p", "response_format"]
        .map(String::from)
        .into();
    let (out, mut t) = translated_dropping(&body, &drop).expect("translated");
    let m: Value = serde_json::from_slice(&out).expect("json");
    for field in ["temperature", "top_p", "response_format", "output_config"] {
        assert!(m.get(field).is_none(), "{field}: {m}");
    }
    let mut resp = pingora_http::ResponseHeader::build(200, None).expect("header");
    t.on_header(&mut resp).expect("header");
    assert_eq!(
        resp.headers["x-modelgate-params-dropped"],
        "response_format, temperature, top_p"
    );
    // What the list does not name is still refused, by name.
    let refused = translated_dropping(&body, &drop[..2]).err();
    assert_eq!(
        refused.map(|e| e.parts().param),
        Some(Some("response_format"))
    );
}

/// The client's bytes for a provider's stream fed in `pieces`, then its end.
fn feed_stream(t: &mut Translation, pieces: &[&[u8]]) -> Vec<u8> {
    let mut resp = pingora_http::ResponseHeader::build(200, None).expect("header");
    resp.insert_header("content-type", "text/event-stream")
        .expect("header");
    t.on_header(&mut resp).expect("header");
    let mut out = Vec::new();
    for p in pieces {
        out.extend_from_slice(&t.feed(Some(p), false));
    }
    out.extend_from_slice(&t.feed(None, true));
    out
}

/// Anthropic's documented tool-use stream (abridged), as the provider sends it.
const TOOL_STREAM: &str = include_str!("../../tests/vectors/anthropic-tool-use-stream.sse");

fn translate_stream(pieces: &[&[u8]], include_usage: bool) -> Vec<u8> {
    let (_, mut t) = asked(&json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": include_usage},
        "messages": [{"role": "user", "content": "hi"}],
    }));
    feed_stream(&mut t, pieces)
}

fn chunks(out: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(out).expect("utf-8");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("a chunk"))
        .collect()
}

#[test]
fn anthropics_tool_stream_reads_as_chat_chunks_split_anywhere() {
    // (`created` is the clock's: two runs may straddle a second.)
    let timeless = |out: &[u8]| {
        let mut c = chunks(out);
        c.iter_mut().for_each(|c| c["created"] = Value::Null);
        c
    };
    let whole = translate_stream(&[TOOL_STREAM.as_bytes()], true);
    let bytes = TOOL_STREAM.as_bytes();
    for at in (0..bytes.len()).step_by(7) {
        let (a, b) = bytes.split_at(at);
        assert_eq!(
            timeless(&translate_stream(&[a, b], true)),
            timeless(&whole),
            "split at {at}"
        );
    }
    let c = chunks(&whole);
    assert!(c.iter().all(|c| c["id"] == "msg_014p7gG3wDgGV9EUtLvnow3U"));
    assert_eq!(c[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = c
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Okay, let's check the weather.");
    let calls: Vec<&Value> = c
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(calls[0]["id"], "toolu_01T1x1fJ34qAmk2tNTrN7Up6");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert!(calls.iter().all(|c| c["index"] == 0));
    let args: String = calls
        .iter()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, "{\"location\": \"San Francisco, CA\"}");
    let n = c.len();
    assert_eq!(c[n - 2]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(c[n - 1]["choices"], json!([]));
    assert_eq!(
        c[n - 1]["usage"],
        json!({"prompt_tokens": 472, "completion_tokens": 89, "total_tokens": 561,
               "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}})
    );
    // Without `include_usage`, no usage chunk.
    let plain = chunks(&translate_stream(&[bytes], false));
    assert!(plain.iter().all(|c| c.get("usage").is_none()));
}

#[test]
fn a_stream_cut_by_the_budget_ends_with_an_error_and_done() {
    let cut = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"m\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
        "event: error\n",
        "data: {\"type\":\"error\",\"error\":{\"type\":\"budget_exhausted\",\"message\":\"The key's budget cannot pay for more output: the reply was cut.\"}}\n\n",
    );
    let out = translate_stream(&[cut.as_bytes()], false);
    let c = chunks(&out);
    let last = c.last().expect("an error");
    assert_eq!(last["error"]["code"], "budget_exhausted");
    assert_eq!(last["error"]["type"], "insufficient_quota");
}

#[test]
fn a_pool_passes_its_native_apis_and_translates_the_others() {
    let pool = |lines: &str| -> PoolConfig {
        let toml = format!(
            "[listeners]\nmain = \"127.0.0.1:1\"\ndirect = \"127.0.0.1:2\"\n[keys]\nfile = \"k.toml\"\n\
             [[pools]]\nname = \"p\"\nupstreams = [\"http://127.0.0.1:9\"]\n{lines}\n"
        );
        let c = crate::config::Config::parse(std::path::Path::new("c.toml"), &toml).expect("valid");
        c.live.pools[0].clone()
    };
    let openai = pool("");
    for api in Api::ALL {
        assert_eq!(plan(Some(api), &openai), Ok(None), "{api:?}");
    }
    assert_eq!(plan(None, &openai), Ok(None));
    let chat_only = pool("native = [\"chat\", \"embeddings\"]");
    assert_eq!(
        plan(Some(Api::Messages), &chat_only),
        Ok(Some(Plan {
            from: Api::Messages,
            to: Api::Chat
        }))
    );
    assert!(plan(Some(Api::Images), &chat_only).is_err());
    let claude = pool("provider = \"anthropic\"");
    assert_eq!(claude.auth_header, crate::config::AuthHeader::XApiKey);
    assert_eq!(plan(Some(Api::Messages), &claude), Ok(None));
    assert_eq!(
        plan(Some(Api::Chat), &claude),
        Ok(Some(Plan {
            from: Api::Chat,
            to: Api::Messages
        }))
    );
    assert!(plan(Some(Api::Embeddings), &claude).is_err());
    assert!(plan(None, &claude).is_err());
}

/// OpenAI's streamed function call, then the usage chunk.
fn openai_tool_stream() -> String {
    include_str!("../../tests/vectors/openai-function-call-stream.sse").to_string()
}

fn messages_stream(pieces: &[&[u8]]) -> Vec<(String, Value)> {
    let body = json!({"model": "m", "max_tokens": 100, "stream": true,
                      "messages": [{"role": "user", "content": "weather?"}]})
    .to_string();
    let a = Asked {
        body: body.as_bytes(),
        model: "gpt-4.1",
        cap: None,
        default_max_tokens: 10,
        drop: &[],
    };
    let plan = Plan {
        from: Api::Messages,
        to: Api::Chat,
    };
    let (sent, mut t) = request(plan, &a).expect("translated");
    let sent: Value = serde_json::from_slice(&sent).expect("json");
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    let out = feed_stream(&mut t, pieces);
    let mut reader = sse::Reader::default();
    let mut events = Vec::new();
    reader.feed(&out, &mut events).expect("bounded");
    events
        .into_iter()
        .map(|e| (e.name, serde_json::from_slice(&e.data).expect("json")))
        .collect()
}

#[test]
fn an_openai_tool_stream_reads_as_anthropic_events_split_anywhere() {
    let stream = openai_tool_stream();
    let whole = messages_stream(&[stream.as_bytes()]);
    for at in (0..stream.len()).step_by(11) {
        let (a, b) = stream.as_bytes().split_at(at);
        assert_eq!(messages_stream(&[a, b]), whole, "split at {at}");
    }
    let names: Vec<&str> = whole.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    let start = &whole
        .iter()
        .find(|(n, _)| n == "content_block_start")
        .expect("a block")
        .1;
    assert_eq!(
        start["content_block"],
        json!({"type": "tool_use", "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "name": "get_weather", "input": {}})
    );
    let args: String = whole
        .iter()
        .filter_map(|(_, v)| v["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(args, "{\"location\":\"Paris, France\"}");
    let delta = &whole[whole.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(
        delta["usage"],
        json!({"input_tokens": 12, "output_tokens": 9, "cache_read_input_tokens": 8, "cache_creation_input_tokens": 0})
    );
}

#[test]
fn a_message_request_becomes_a_chat_request() {
    let body = json!({
        "model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "Terse."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}], "is_error": false}]},
        ],
        "tools": [{"name": "w", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "w"},
    })
    .to_string();
    let a = Asked {
        body: body.as_bytes(),
        model: "gpt-4.1",
        cap: Some(20),
        default_max_tokens: 10,
        drop: &[],
    };
    let plan = Plan {
        from: Api::Messages,
        to: Api::Chat,
    };
    let (sent, _) = request(plan, &a).expect("translated");
    let sent: Value = serde_json::from_slice(&sent).expect("json");
    assert_eq!(
        sent,
        json!({
            "model": "gpt-4.1", "max_completion_tokens": 20,
            "messages": [
                {"role": "system", "content": "Terse."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            ],
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "w"}},
        })
    );
}

/// Codex's tools (as it sends them): functions, a namespace of function and free-form
/// (`custom`) tools in an `additional_tools` input item, and a hosted web search.
#[test]
fn codex_style_tools_go_as_functions_and_come_back_as_their_own_items() {
    let body = json!({
        "model": "m", "store": false, "input": [
            {"type": "additional_tools", "role": "developer", "tools": [
                {"type": "namespace", "name": "functions", "description": "", "tools": [
                    {"type": "custom", "name": "exec", "description": "Run JavaScript."},
                    {"type": "function", "name": "wait", "parameters": {"type": "object"}}]}]},
            {"role": "user", "content": "go"},
            {"type": "custom_tool_call", "call_id": "c1", "namespace": "functions", "name": "exec", "input": "1+1"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "2"},
        ],
        "tools": [{"type": "web_search"}],
    })
    .to_string();
    let plan = Plan {
        from: Api::Responses,
        to: Api::Chat,
    };
    let a = Asked {
        body: body.as_bytes(),
        model: "gpt-x",
        cap: None,
        default_max_tokens: 10,
        drop: &[],
    };
    let (sent, mut t) = request(plan, &a).expect("translated");
    let sent: Value = serde_json::from_slice(&sent).expect("json");
    let names: Vec<&str> = sent["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["functions__exec", "functions__wait"]);
    let call = &sent["messages"][1]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "functions__exec");
    assert_eq!(call["function"]["arguments"], "{\"input\":\"1+1\"}");
    assert_eq!(sent["messages"][2]["role"], "tool");
    let mut resp = pingora_http::ResponseHeader::build(200, None).expect("header");
    resp.insert_header("content-type", "application/json")
        .expect("header");
    t.on_header(&mut resp).expect("header");
    assert_eq!(
        resp.headers
            .get("x-modelgate-tools-dropped")
            .map(|v| v.as_bytes()),
        Some(&b"web_search"[..])
    );
    let reply = json!({"id": "chatcmpl-1", "model": "gpt-x", "choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "functions__exec", "arguments": "{\"input\":\"2*3\"}"}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}});
    let out = t.feed(Some(reply.to_string().as_bytes()), true);
    let r: Value = serde_json::from_slice(&out).expect("a response");
    assert_eq!(
        (
            &r["output"][0]["type"],
            &r["output"][0]["namespace"],
            &r["output"][0]["name"],
            &r["output"][0]["input"]
        ),
        (
            &json!("custom_tool_call"),
            &json!("functions"),
            &json!("exec"),
            &json!("2*3")
        )
    );
}
