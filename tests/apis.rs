//! The Responses API and Anthropic's Messages API through the gateway: routed by model,
//! metered exactly (plain, streamed at any split, cut), stored responses found again on the
//! upstream that made them, keys from `x-api-key`, the pool's credential in the header the
//! pool names, and the gateway's own errors in Anthropic's shape on `/v1/messages`.

mod common;

use common::*;
use serde_json::{Value, json};

fn responses_body(stream: bool) -> Value {
    json!({"model": "echo-1", "input": "say hello to me", "instructions": "be brief", "stream": stream})
}

fn messages_body(stream: bool) -> Value {
    json!({"model": "echo-1", "max_tokens": 64, "stream": stream, "system": "be brief",
           "messages": [{"role": "user", "content": [{"type": "text", "text": "say hello to me"}]}]})
}

/// POSTs with the key in `x-api-key` and Anthropic's version header, as its SDK does.
async fn anthropic(
    base: &str,
    path: &str,
    key: &str,
    body: &Value,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = client()
        .post(format!("{base}{path}"))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01");
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req.json(body).send().await.expect("send")
}

#[tokio::test]
async fn responses_are_metered_plain_streamed_at_any_split_and_cut() {
    let g = start();
    // Prompt: 4 input words + 2 instruction words; reply: the mock's 8 words.
    let resp = post_json(&g.main, "/v1/responses", &responses_body(false)).await;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["content"][0]["text"], MOCK_TEXT);
    let r = await_record(&g, &id).await;
    assert_eq!(
        (
            r["endpoint"].as_str(),
            r["prompt_tokens"].as_u64(),
            r["completion_tokens"].as_u64()
        ),
        (Some("responses"), Some(6), Some(8)),
        "{r}"
    );
    assert_eq!(r["estimated"], false);

    for split in ["1", "9", "100"] {
        let resp = send(
            &g.direct,
            "/v1/responses",
            Some(KEY),
            &responses_body(true),
            &[("x-mock-split", split)],
        )
        .await;
        assert_eq!(resp.status(), 200);
        let id = request_id(&resp);
        let text = resp.text().await.expect("body");
        assert!(text.contains("event: response.completed"), "{text}");
        let r = await_record(&g, &id).await;
        assert_eq!(
            (
                r["prompt_tokens"].as_u64(),
                r["completion_tokens"].as_u64(),
                r["total_tokens"].as_u64()
            ),
            (Some(6), Some(8), Some(14)),
            "split {split}: {r}"
        );
        assert_eq!(r["estimated"], false);
        assert_eq!(r["stream"], true);
        assert!(r["ttft_ms"].as_u64().is_some(), "{r}");
    }

    // Cut after 2 of the 8 deltas (created, in_progress, item, part, 2 deltas): the tokens
    // so far are kept, estimated and marked so.
    let resp = send(
        &g.main,
        "/v1/responses",
        Some(KEY),
        &responses_body(true),
        &[("x-mock-cut-after", "6")],
    )
    .await;
    let id = request_id(&resp);
    assert!(resp.bytes().await.is_err(), "the client sees the cut");
    let r = await_record(&g, &id).await;
    assert_eq!(r["status"], 502, "{r}");
    assert_eq!(r["estimated"], true, "{r}");
    assert!(
        r["completion_tokens"]
            .as_u64()
            .is_some_and(|n| (1..8).contains(&n)),
        "{r}"
    );
    assert!(r["prompt_tokens"].as_u64() > Some(0), "{r}");
}

#[tokio::test]
async fn a_stored_response_is_found_on_the_upstream_that_made_it_by_its_key_only() {
    let second = start_mock(&[]);
    let g = start_with(Setup {
        extra_config: format!(
            r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "two"
upstreams = ["http://127.0.0.1:@MOCK@", "http://127.0.0.1:{}"]

[[models]]
name = "two-model"
pool = "two"
upstream_model = "echo-1"
price = {{ request = 0.5 }}
"#,
            second.port
        ),
        ..Setup::default()
    });
    let mut body = responses_body(false);
    body["model"] = json!("two-model");
    let mut ids = Vec::new();
    for _ in 0..4 {
        let v: Value = post_json(&g.main, "/v1/responses", &body)
            .await
            .json()
            .await
            .expect("json");
        ids.push(v["id"].as_str().expect("id").to_string());
    }
    // Round robin put them on both upstreams; each is found on its own.
    for id in &ids {
        let resp = get(&g.direct, &format!("/v1/responses/{id}"), Some(KEY)).await;
        assert_eq!(resp.status(), 200, "{id}");
        let rid = request_id(&resp);
        let v: Value = resp.json().await.expect("json");
        assert_eq!(v["id"], id.as_str());
        let r = await_record(&g, &rid).await;
        // Reading a stored response is not a new one: it costs nothing.
        assert_eq!(
            (
                r["endpoint"].as_str(),
                r["model"].as_str(),
                r["cost"].as_f64()
            ),
            (Some("responses"), Some("two-model"), Some(0.0)),
            "{r}"
        );
        let items: Value = get(
            &g.main,
            &format!("/v1/responses/{id}/input_items"),
            Some(KEY),
        )
        .await
        .json()
        .await
        .expect("json");
        assert_eq!(
            items["data"][0]["content"][0]["text"], "say hello to me",
            "{items}"
        );
    }
    // Another key cannot see it; an unknown id is a clear 404.
    let (status, e) = error_of(
        get(
            &g.main,
            &format!("/v1/responses/{}", ids[0]),
            Some(OTHER_KEY),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, e["code"].as_str()),
        (404, Some("response_not_found"))
    );
    let (status, e) = error_of(get(&g.main, "/v1/responses/resp_unknown", Some(KEY)).await).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (404, Some("response_not_found"))
    );
    // Cancel and delete go to it too; once deleted it is gone.
    let cancelled: Value = send(
        &g.main,
        &format!("/v1/responses/{}/cancel", ids[1]),
        Some(KEY),
        &json!({}),
        &[],
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(cancelled["status"], "cancelled");
    let del = client()
        .delete(format!("{}/v1/responses/{}", g.main, ids[1]))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("send");
    assert_eq!(del.status(), 200);
    assert_eq!(del.json::<Value>().await.expect("json")["deleted"], true);
    let (status, _) =
        error_of(get(&g.main, &format!("/v1/responses/{}", ids[1]), Some(KEY)).await).await;
    assert_eq!(status, 404);
    // The wrong method says which ones the path takes.
    let resp = send(
        &g.main,
        &format!("/v1/responses/{}", ids[0]),
        Some(KEY),
        &json!({}),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "GET, DELETE");
}

#[tokio::test]
async fn messages_take_the_key_from_x_api_key_and_are_metered_plain_and_streamed() {
    let g = start_with(Setup {
        extra_config: r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "anthropic-like"
upstreams = ["http://127.0.0.1:@MOCK@"]
api_key = "sk-ant-pool-credential"
auth_header = "x-api-key"

[[models]]
name = "claude-like"
pool = "anthropic-like"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    // Prompt: 4 message words + 2 system words.
    let resp = anthropic(&g.main, "/v1/messages", KEY, &messages_body(false), &[]).await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(
        h["x-mock-authorization"],
        format!("Bearer {POOL_KEY}"),
        "the local pool sends Bearer"
    );
    assert_eq!(
        h["x-mock-x-api-key"], "",
        "the client's key never goes upstream"
    );
    assert_eq!(h["x-mock-anthropic-version"], "2023-06-01");
    let id = request_id(&resp);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["content"][0]["text"], MOCK_TEXT);
    let r = await_record(&g, &id).await;
    assert_eq!(
        (
            r["endpoint"].as_str(),
            r["prompt_tokens"].as_u64(),
            r["completion_tokens"].as_u64()
        ),
        (Some("messages"), Some(6), Some(8)),
        "{r}"
    );

    // A pool with auth_header = "x-api-key" gets its credential there, bare.
    let mut body = messages_body(false);
    body["model"] = json!("claude-like");
    let resp = send(&g.main, "/v1/messages", Some(KEY), &body, &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-mock-x-api-key"], "sk-ant-pool-credential");
    assert_eq!(resp.headers()["x-mock-authorization"], "");

    for split in ["1", "13", "200"] {
        let resp = anthropic(
            &g.direct,
            "/v1/messages",
            KEY,
            &messages_body(true),
            &[("x-mock-split", split)],
        )
        .await;
        let id = request_id(&resp);
        let text = resp.text().await.expect("body");
        assert!(text.contains("event: message_stop"), "{text}");
        let r = await_record(&g, &id).await;
        assert_eq!(
            (
                r["prompt_tokens"].as_u64(),
                r["completion_tokens"].as_u64(),
                r["estimated"].as_bool()
            ),
            (Some(6), Some(8), Some(false)),
            "split {split}: {r}"
        );
    }

    // Cut before `message_delta`: the prompt count from `message_start` stays exact, the
    // output so far is estimated.
    let resp = anthropic(
        &g.main,
        "/v1/messages",
        KEY,
        &messages_body(true),
        &[("x-mock-cut-after", "6")],
    )
    .await;
    let id = request_id(&resp);
    assert!(resp.bytes().await.is_err());
    let r = await_record(&g, &id).await;
    assert_eq!(
        (r["prompt_tokens"].as_u64(), r["estimated"].as_bool()),
        (Some(6), Some(true)),
        "{r}"
    );
    assert!(
        r["completion_tokens"]
            .as_u64()
            .is_some_and(|n| (1..8).contains(&n)),
        "{r}"
    );

    // Counting tokens is not spending them, not even a model's per-request price.
    let mut body = messages_body(false);
    body["model"] = json!("priced-model");
    let resp = anthropic(&g.main, "/v1/messages/count_tokens", KEY, &body, &[]).await;
    let id = request_id(&resp);
    assert_eq!(resp.json::<Value>().await.expect("json")["input_tokens"], 6);
    let r = await_record(&g, &id).await;
    assert_eq!(
        (
            r["endpoint"].as_str(),
            r["total_tokens"].as_u64(),
            r["cost"].as_f64()
        ),
        (Some("messages"), Some(0), Some(0.0)),
        "{r}"
    );
}

/// An Anthropic client (`anthropic-version`) gets the model list in Anthropic's shape, with its
/// key from `x-api-key`; anyone else gets OpenAI's, and `x-api-key` is no key there.
#[tokio::test]
async fn the_model_list_speaks_anthropic_to_an_anthropic_client() {
    let g = start();
    let list = |key_header: &'static str, anthropic: bool, path: &'static str| {
        let mut req = client()
            .get(format!("{}{path}", g.main))
            .header(key_header, KEY);
        if anthropic {
            req = req.header("anthropic-version", "2023-06-01");
        }
        req.send()
    };
    let resp = list("x-api-key", true, "/v1/models").await.expect("send");
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["has_more"], false, "{v}");
    assert_eq!(v["data"][0]["type"], "model", "{v}");
    assert_eq!(v["first_id"], v["data"][0]["id"], "{v}");
    assert!(
        v["data"][0]["created_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{v}"
    );
    let resp = list("x-api-key", true, "/v1/models/echo-1")
        .await
        .expect("send");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(
        (v["id"].as_str(), v["type"].as_str()),
        (Some("echo-1"), Some("model"))
    );
    let resp = list("x-api-key", true, "/v1/models/nope")
        .await
        .expect("send");
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    // Without `anthropic-version`: OpenAI's API, whose key is only the bearer.
    let resp = list("x-api-key", false, "/v1/models").await.expect("send");
    assert_eq!(resp.status(), 401);
    let resp = client()
        .get(format!("{}/v1/models", g.main))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("send");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["object"], "list", "{v}");
}

#[tokio::test]
async fn the_gateways_errors_on_messages_are_in_anthropics_shape() {
    let g = start();
    let shape = |v: &Value, kind: &str| {
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(v["request_id"].as_str().is_some(), "{v}");
    };
    let cases: [(&str, Value, u16, &str); 4] = [
        (
            "sk-wrong",
            messages_body(false),
            401,
            "authentication_error",
        ),
        (
            KEY,
            json!({"model": "nope", "max_tokens": 1, "messages": []}),
            404,
            "not_found_error",
        ),
        (
            KEY,
            json!({"max_tokens": 1, "messages": []}),
            400,
            "invalid_request_error",
        ),
        (
            KEY,
            json!({"model": "gone-model", "max_tokens": 1, "messages": []}),
            502,
            "api_error",
        ),
    ];
    for (key, body, status, kind) in cases {
        let resp = anthropic(&g.main, "/v1/messages", key, &body, &[]).await;
        assert_eq!(resp.status(), status, "{kind}");
        shape(&resp.json().await.expect("json"), kind);
    }
    // The upstream's own non-JSON error, wrapped in the same shape.
    let resp = anthropic(
        &g.main,
        "/v1/messages",
        KEY,
        &messages_body(false),
        &[("x-mock-status", "503"), ("x-mock-text-body", "1")],
    )
    .await;
    assert_eq!(resp.status(), 503);
    shape(&resp.json().await.expect("json"), "overloaded_error");
    // A key that may not use the group: 403 permission_error; OpenAI paths keep their shape.
    let resp = anthropic(
        &g.main,
        "/v1/messages",
        MODELS_ONLY_KEY,
        &messages_body(false),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 403);
    shape(&resp.json().await.expect("json"), "permission_error");
    let (status, _) = error_of(
        send(
            &g.main,
            "/v1/responses",
            Some(MODELS_ONLY_KEY),
            &responses_body(false),
            &[],
        )
        .await,
    )
    .await;
    assert_eq!(status, 403);
    // On the OpenAI paths the key is read only from `Authorization: Bearer` (the contract): a
    // good key in x-api-key there is no key at all, 401 in OpenAI's shape, and so is a wrong one.
    let chat = client()
        .post(format!("{}/v1/chat/completions", g.main))
        .json(&chat_body("echo-1", false));
    let models = client().get(format!("{}/v1/models", g.main));
    for req in [chat, models] {
        let resp = req.header("x-api-key", KEY).send().await.expect("send");
        let (status, e) = error_of(resp).await;
        assert_eq!((status, e["code"].as_str()), (401, Some("invalid_api_key")));
    }
    let resp = client()
        .post(format!("{}/v1/chat/completions", g.main))
        .header("x-api-key", "sk-wrong")
        .json(&chat_body("echo-1", false))
        .send()
        .await
        .expect("send");
    let (status, e) = error_of(resp).await;
    assert_eq!((status, e["code"].as_str()), (401, Some("invalid_api_key")));
}

/// The SDKs send a model id as one encoded path segment: `org/model` arrives as `org%2Fmodel`.
#[tokio::test]
async fn a_model_id_with_a_slash_is_retrieved_encoded_or_not() {
    let g = start_with(Setup {
        extra_config:
            "[[models]]\nname = \"acme/llama 3\"\npool = \"local\"\nupstream_model = \"echo-1\"\n"
                .into(),
        ..Setup::default()
    });
    for path in [
        "/v1/models/acme%2Fllama%203",
        "/v1/models/acme/llama%203",
        "/v1/models/acme%2fllama%203",
    ] {
        let resp = get(&g.main, path, Some(KEY)).await;
        assert_eq!(resp.status(), 200, "{path}");
        let v: serde_json::Value = resp.json().await.expect("json");
        assert_eq!(v["id"], "acme/llama 3", "{path}");
    }
    let resp = get(&g.main, "/v1/models/acme%2Fnope", Some(KEY)).await;
    let (status, e) = error_of(resp).await;
    assert_eq!(status, 404);
    assert!(
        e["message"].as_str().unwrap_or("").contains("acme/nope"),
        "{e}"
    );
}

/// What Messages require besides the model is the gateway's to refuse, in Anthropic's shape:
/// `messages` and a positive `max_tokens` (count_tokens: `messages`). A wrong key is told to
/// come in `x-api-key`; two different keys in `x-api-key` and `Authorization` are refused.
#[tokio::test]
async fn messages_need_their_fields_and_one_key() {
    let g = start();
    let mut no_max = messages_body(false);
    no_max.as_object_mut().expect("object").remove("max_tokens");
    let mut zero_max = messages_body(false);
    zero_max["max_tokens"] = json!(0);
    let mut no_messages = messages_body(false);
    no_messages
        .as_object_mut()
        .expect("object")
        .remove("messages");
    for (path, body, names) in [
        ("/v1/messages", no_max, "max_tokens"),
        ("/v1/messages", zero_max, "max_tokens"),
        ("/v1/messages", no_messages.clone(), "messages"),
        ("/v1/messages/count_tokens", no_messages, "messages"),
    ] {
        let resp = anthropic(&g.main, path, KEY, &body, &[]).await;
        assert_eq!(resp.status(), 400, "{path} {names}");
        let v: Value = resp.json().await.expect("json");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap_or("").contains(names),
            "{v}"
        );
    }
    let resp = anthropic(
        &g.main,
        "/v1/messages",
        "sk-wrong",
        &messages_body(false),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("x-api-key"),
        "{v}"
    );
    let bearer = format!("Bearer {OTHER_KEY}");
    let resp = anthropic(
        &g.main,
        "/v1/messages",
        KEY,
        &messages_body(false),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(resp.status(), 400);
    let same = format!("Bearer {KEY}");
    let resp = anthropic(
        &g.main,
        "/v1/messages",
        KEY,
        &messages_body(false),
        &[("authorization", &same)],
    )
    .await;
    assert_eq!(resp.status(), 200);
}
