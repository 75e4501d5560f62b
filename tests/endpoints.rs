//! Every endpoint of the contract, on both listeners, through the real gateway to the mock.

mod common;

use common::*;
use reqwest::multipart::{Form, Part};
use serde_json::json;

#[tokio::test]
async fn every_json_endpoint_answers_on_both_listeners() {
    let g = start();
    let cases = [
        (
            "/v1/chat/completions",
            chat_body("echo-1", false),
            "chat.completion",
        ),
        (
            "/v1/completions",
            json!({"model": "echo-1", "prompt": "say hi"}),
            "text_completion",
        ),
        (
            "/v1/embeddings",
            json!({"model": "echo-1", "input": ["a b", "c"]}),
            "list",
        ),
    ];
    for base in g.bases() {
        for (path, body, object) in &cases {
            let resp = post_json(&base, path, body).await;
            assert_eq!(resp.status(), 200, "{base}{path}");
            assert_eq!(resp.headers()["x-mock-path"], *path);
            let v: serde_json::Value = resp.json().await.expect("json");
            assert_eq!(v["object"], *object, "{base}{path}: {v}");
        }
        let v: serde_json::Value = post_json(
            &base,
            "/v1/moderations",
            &json!({"model": "echo-1", "input": "hi"}),
        )
        .await
        .json()
        .await
        .expect("json");
        assert_eq!(v["results"][0]["flagged"], false);
        let v: serde_json::Value = post_json(
            &base,
            "/v1/images/generations",
            &json!({"model": "echo-1", "prompt": "a cat", "n": 2}),
        )
        .await
        .json()
        .await
        .expect("json");
        assert_eq!(v["data"].as_array().map(Vec::len), Some(2), "{v}");
    }
}

#[tokio::test]
async fn chat_reply_is_the_upstreams_and_carries_usage() {
    let g = start();
    let resp = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    let v: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], MOCK_TEXT);
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 8);
}

#[tokio::test]
async fn audio_speech_returns_the_binary_reply_unchanged() {
    let g = start();
    for base in g.bases() {
        let resp = post_json(
            &base,
            "/v1/audio/speech",
            &json!({"model": "echo-1", "input": "hello", "voice": "alloy"}),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "audio/mpeg");
        let bytes = resp.bytes().await.expect("body");
        assert!(bytes.starts_with(b"ID3"));
        assert_eq!(bytes.len(), 4096);
    }
}

fn audio_form(model: &str, size: usize) -> Form {
    let file = Part::bytes(vec![7u8; size])
        .file_name("a.wav")
        .mime_str("audio/wav")
        .expect("mime");
    Form::new()
        .part("file", file)
        .text("model", model.to_string())
}

#[tokio::test]
async fn multipart_audio_and_image_uploads_work_on_both_listeners() {
    let g = start();
    for base in g.bases() {
        for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
            let resp = client()
                .post(format!("{base}{path}"))
                .bearer_auth(KEY)
                .multipart(audio_form("echo-1", 1000))
                .send()
                .await
                .expect("send");
            assert_eq!(resp.status(), 200, "{base}{path}");
            assert_eq!(resp.headers()["x-mock-model"], "echo-1");
            let v: serde_json::Value = resp.json().await.expect("json");
            assert_eq!(v["text"], "mock transcript of 1000 bytes", "{v}");
        }
        for path in ["/v1/images/edits", "/v1/images/variations"] {
            let image = Part::bytes(b"\x89PNG fake".to_vec())
                .file_name("i.png")
                .mime_str("image/png")
                .expect("mime");
            let form = Form::new()
                .part("image", image)
                .text("model", "echo-1")
                .text("prompt", "a hat");
            let resp = client()
                .post(format!("{base}{path}"))
                .bearer_auth(KEY)
                .multipart(form)
                .send()
                .await
                .expect("send");
            assert_eq!(resp.status(), 200, "{base}{path}");
            let v: serde_json::Value = resp.json().await.expect("json");
            assert!(v["data"][0]["b64_json"].is_string(), "{v}");
        }
    }
}

#[tokio::test]
async fn the_upstream_sees_the_pool_key_and_upstream_model_never_the_client_key_json() {
    let g = start();
    let resp = send(
        &g.direct,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("big-model", false),
        &[
            ("api-key", KEY),
            ("x-api-key", KEY),
            ("accept-encoding", "gzip, br"),
        ],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-mock-authorization"],
        format!("Bearer {POOL_KEY}")
    );
    assert_eq!(resp.headers()["x-mock-model"], "upstream/big-model-v2");
    // Asked for uncompressed, in so many words: the gateway reads the usage as it passes.
    assert_eq!(resp.headers()["x-mock-accept-encoding"], "identity");
    let all = format!("{:?}", resp.headers());
    assert!(!all.contains(KEY), "client key leaked upstream: {all}");
}

#[tokio::test]
async fn the_upstream_sees_the_pool_key_and_upstream_model_never_the_client_key_multipart() {
    let g = start();
    let resp = client()
        .post(format!("{}/v1/audio/transcriptions", g.main))
        .bearer_auth(KEY)
        .multipart(audio_form("big-model", 5000))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-mock-authorization"],
        format!("Bearer {POOL_KEY}")
    );
    assert_eq!(resp.headers()["x-mock-model"], "upstream/big-model-v2");
    let v: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(
        v["text"], "mock transcript of 5000 bytes",
        "the file survived the rewrite"
    );
}

#[tokio::test]
async fn models_are_listed_from_config_filtered_by_the_key() {
    let g = start();
    for base in g.bases() {
        let v: serde_json::Value = get(&base, "/v1/models", Some(KEY))
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(v["object"], "list");
        let ids: Vec<&str> = v["data"]
            .as_array()
            .expect("data")
            .iter()
            .filter_map(|m| m["id"].as_str())
            .collect();
        assert_eq!(ids, ["echo-1", "big-model", "gone-model", "priced-model"]);
        for m in v["data"].as_array().expect("data") {
            assert_eq!(m["object"], "model");
            assert!(m["created"].is_i64() && m["owned_by"].is_string(), "{m}");
        }
        let v: serde_json::Value = get(&base, "/v1/models", Some(ECHO_ONLY_KEY))
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(v["data"].as_array().map(Vec::len), Some(1), "{v}");
        let one = get(&base, "/v1/models/big-model", Some(KEY)).await;
        assert_eq!(one.status(), 200);
        let m: serde_json::Value = one.json().await.expect("json");
        assert_eq!(m["id"], "big-model");
        let hidden = get(&base, "/v1/models/big-model", Some(ECHO_ONLY_KEY)).await;
        let (status, e) = error_of(hidden).await;
        assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")));
    }
}

#[tokio::test]
async fn every_response_carries_a_distinct_request_id() {
    let g = start();
    let a = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    let b = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    let (a, b) = (
        a.headers()["x-request-id"].clone(),
        b.headers()["x-request-id"].clone(),
    );
    assert_ne!(a, b);
    assert!(a.to_str().expect("ascii").starts_with("req_"));
}

/// A path spelled another way than the API names it (an encoded `/` or letter, an empty or dot
/// segment) is refused: the upstream decodes it, so `/v1/chat%2Fcompletions` would be a chat
/// there while here it is another endpoint. And another endpoint's stream is metered from the
/// usage its events report (it counted nothing before), as its plain reply is.
#[tokio::test]
async fn a_path_spelled_another_way_is_refused_and_another_endpoints_stream_is_metered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    let body = serde_json::to_string(&chat_body("echo-1", true)).expect("json");
    for path in [
        "/v1/chat%2Fcompletions",
        "/v1/%63hat/completions",
        "/v1//chat/completions",
        "/v1/x/../chat/completions",
        "/v1/responses/%72esp_1/cancel",
        "/v1/chat/completions;x",
        "/v1/chat%5Ccompletions",
        "/v1/Chat/Completions",
        "/v1/models/../chat/completions",
    ] {
        let mut s = raw_connect(&g.main).await;
        let head = chat_head(KEY, body.len(), "Connection: close\r\n").replacen(
            "/v1/chat/completions",
            path,
            1,
        );
        s.write_all((head + &body).as_bytes()).await.expect("send");
        let mut reply = String::new();
        s.read_to_string(&mut reply).await.expect("reply");
        assert!(reply.starts_with("HTTP/1.1 400"), "{path}: {reply}");
        assert!(reply.contains(r#""param":"path""#), "{path}: {reply}");
    }
    // Counted from the usage its events report, like a plain reply of such an endpoint; never
    // estimated (its text need not be what is billed).
    for include_usage in [true, false] {
        let mut body = chat_body("echo-1", true);
        if include_usage {
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        let resp = send(&g.main, "/v1/generate", Some(KEY), &body, &[]).await;
        assert_eq!(resp.status(), 200);
        let id = request_id(&resp);
        let text = resp.text().await.expect("stream");
        // Passed on as it came: the upstream's own end, once.
        assert_eq!(text.matches("data: [DONE]").count(), 1, "{text}");
        let r = await_record(&g, &id).await;
        assert_eq!(
            (r["endpoint"].as_str(), r["estimated"].as_bool()),
            (Some("other"), Some(false)),
            "{r}"
        );
        assert_eq!(
            r["completion_tokens"].as_u64() > Some(0),
            include_usage,
            "{r}"
        );
    }
}

/// More headers than go upstream (100, or 32 KiB of them) get 431 before anything is sent: a
/// model server that drops the connection on them would look down, and every upstream of the
/// pool would be ejected for one client's request.
#[tokio::test]
async fn too_many_request_headers_get_431_and_never_reach_the_upstream() {
    let g = start();
    let many: Vec<(String, String)> = (0..150).map(|i| (format!("x-h-{i}"), "v".into())).collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let body = chat_body("echo-1", false);
    let (status, e) =
        error_of(send(&g.main, "/v1/chat/completions", Some(KEY), &body, &refs).await).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (431, Some("request_headers_too_large")),
        "{e}"
    );
    let big = "v".repeat(33 * 1024);
    let (status, _) = error_of(
        send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &body,
            &[("x-big", big.as_str())],
        )
        .await,
    )
    .await;
    assert_eq!(status, 431);
    // A usual request is untouched.
    assert_eq!(
        send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &body,
            &refs[..20]
        )
        .await
        .status(),
        200
    );
}

/// Any other model-server `POST /v1/...` whose body names a model is routed by it (group
/// `other`) and metered from the reply's `usage`; one that names none is 404.
#[tokio::test]
async fn other_model_server_paths_are_routed_by_model_and_metered_from_their_usage() {
    let g = start();
    let body = serde_json::json!({
        "model": "echo-1", "query": "a b", "documents": ["c d e", "f"]
    });
    let resp = send(&g.main, "/v1/rerank", Some(KEY), &body, &[]).await;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let reply: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(
        reply["results"].as_array().map(Vec::len),
        Some(2),
        "{reply}"
    );
    let r = await_record(&g, &id).await;
    // Query words × documents + document words: 2 × 2 + 3 + 1.
    assert_eq!(
        (
            r["endpoint"].as_str(),
            r["prompt_tokens"].as_u64(),
            r["total_tokens"].as_u64()
        ),
        (Some("other"), Some(8), Some(8)),
        "{r}"
    );
    assert_eq!(r["estimated"], false);
    for (path, body) in [
        ("/v1/nothing-here", serde_json::json!({"input": "no model"})),
        ("/v1/nothing-here", serde_json::json!("not an object")),
    ] {
        let (status, e) = error_of(send(&g.direct, path, Some(KEY), &body, &[]).await).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (404, Some("not_found")),
            "{body}"
        );
    }
    // An unknown model on such a path is the usual 404, and permissions hold.
    let (status, e) = error_of(
        send(
            &g.main,
            "/v1/score",
            Some(KEY),
            &serde_json::json!({"model": "nope"}),
            &[],
        )
        .await,
    )
    .await;
    assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")));
    let (status, e) =
        error_of(send(&g.main, "/v1/rerank", Some(MODELS_ONLY_KEY), &body, &[]).await).await;
    assert_eq!(
        (status, e["param"].as_str()),
        (403, Some("endpoint")),
        "{e}"
    );
    // A body that names no model is no endpoint at all: 404 also for a key without `other`.
    let (status, e) = error_of(
        send(
            &g.main,
            "/v1/nothing-here",
            Some(MODELS_ONLY_KEY),
            &serde_json::json!({"input": "no model"}),
            &[],
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, e["code"].as_str()),
        (404, Some("not_found")),
        "{e}"
    );
}
