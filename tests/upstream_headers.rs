//! What the upstream says about itself stays with the gateway: its reply reaches the client
//! with its content headers, `retry-after` and the provider's request id (as
//! `x-upstream-request-id`), and what a pool names in `pass_headers`; never its cookies, its
//! `server`, `via`, org and project ids, `alt-svc`, its CORS or its rate limits. `/v1/models`
//! names the configured `owned_by`, never a pool.
//!
//! The mock answers `x-mock-provider-headers: 1` with the headers OpenAI's and Anthropic's
//! replies carry (`openai-organization`, `set-cookie: __cf_bm=…`, `request-id`…).

mod common;

use common::*;

/// Headers the mock's provider-style reply carries that no client may see by default.
const SELF_DESCRIPTION: [&str; 15] = [
    "set-cookie",
    "server",
    "via",
    "openai-organization",
    "openai-project",
    "openai-version",
    "openai-processing-ms",
    "anthropic-organization-id",
    "anthropic-ratelimit-requests-limit",
    "alt-svc",
    "cf-ray",
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "strict-transport-security",
    "request-id",
];

const PASSING: &str = r#"
[[pools]]
name = "passing"
upstreams = ["http://127.0.0.1:@MOCK@"]
health_interval_ms = 0
pass_headers = ["OpenAI-Processing-Ms"]

[[models]]
name = "passing-model"
pool = "passing"
upstream_model = "echo-1"
owned_by = "acme-labs"
"#;

fn provider() -> [(&'static str, &'static str); 1] {
    [("x-mock-provider-headers", "1")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstreams_self_description_never_reaches_clients_plain_or_streamed() {
    let g = start_with(Setup {
        extra_config: PASSING.into(),
        ..Setup::default()
    });
    for (base, stream) in [
        (&g.main, false),
        (&g.main, true),
        (&g.direct, false),
        (&g.direct, true),
    ] {
        let body = chat_body("echo-1", stream);
        let resp = send(base, "/v1/chat/completions", Some(KEY), &body, &provider()).await;
        assert_eq!(resp.status(), 200);
        let h = resp.headers().clone();
        for name in SELF_DESCRIPTION {
            assert!(!h.contains_key(name), "{name} reached the client: {h:?}");
        }
        assert!(
            !h.contains_key("x-ratelimit-limit-requests"),
            "the pool's account limits: {h:?}"
        );
        let theirs = h["x-upstream-request-id"].to_str().expect("ascii");
        assert!(theirs.starts_with("req_mock0"), "{theirs}");
        let ours = h["x-request-id"].to_str().expect("ascii").to_string();
        assert_ne!(ours, theirs, "the gateway's id stays the gateway's");
        let ct = h["content-type"].to_str().expect("ascii");
        let expected = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        assert!(ct.starts_with(expected), "{ct}");
        assert_eq!(
            h["x-mock-model"], "echo-1",
            "named in the pool's pass_headers"
        );
        resp.bytes().await.expect("body");
        let r = await_record(&g, &ours).await;
        assert_eq!(r["status"], 200, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_error_passed_on_keeps_retry_after_and_loses_the_rest() {
    let g = start_with(Setup::default());
    let mut headers = provider().to_vec();
    headers.extend([("x-mock-status", "400"), ("x-mock-retry-after", "7")]);
    let body = chat_body("echo-1", false);
    let resp = send(
        &g.direct,
        "/v1/chat/completions",
        Some(KEY),
        &body,
        &headers,
    )
    .await;
    assert_eq!(resp.status(), 400);
    let h = resp.headers().clone();
    for name in SELF_DESCRIPTION {
        assert!(!h.contains_key(name), "{name} reached the client: {h:?}");
    }
    assert_eq!(h["retry-after"], "7");
    assert!(h.contains_key("x-upstream-request-id"), "{h:?}");
    let err: serde_json::Value = resp.json().await.expect("the upstream's error, as sent");
    assert!(err["error"].is_object(), "{err}");
}

/// A server that echoes the `x-request-id` it was sent (the gateway's) has said nothing of its
/// own: there is no `x-upstream-request-id`, and Anthropic's `request-id` is taken if it sent one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_echoes_the_gateways_request_id_gives_no_upstream_id() {
    let g = start_with(Setup::default());
    let body = chat_body("echo-1", false);
    let echo = [("x-mock-echo-request-id", "1")];
    let resp = send(&g.main, "/v1/chat/completions", Some(KEY), &body, &echo).await;
    assert_eq!(resp.status(), 200);
    assert!(
        !resp.headers().contains_key("x-upstream-request-id"),
        "{:?}",
        resp.headers()
    );
    let both = [
        ("x-mock-echo-request-id", "1"),
        ("x-mock-provider-headers", "1"),
    ];
    let resp = send(&g.main, "/v1/chat/completions", Some(KEY), &body, &both).await;
    let theirs = resp.headers()["x-upstream-request-id"]
        .to_str()
        .expect("ascii");
    assert!(theirs.starts_with("req_mock_anthropic"), "{theirs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_passes_the_headers_it_names_and_models_show_their_owner() {
    let g = start_with(Setup {
        extra_config: PASSING.into(),
        ..Setup::default()
    });
    let body = chat_body("passing-model", true);
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &body,
        &provider(),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(
        h["openai-processing-ms"], "7",
        "named in pass_headers: {h:?}"
    );
    assert!(!h.contains_key("openai-organization"), "{h:?}");
    assert!(
        !h.contains_key("x-mock-model"),
        "this pool does not name x-mock-*: {h:?}"
    );
    resp.bytes().await.expect("body");

    let list: serde_json::Value = get(&g.main, "/v1/models", Some(KEY))
        .await
        .json()
        .await
        .expect("list");
    let data = list["data"].as_array().expect("data");
    assert!(data.len() > 2, "{list}");
    for m in data {
        let owner = m["owned_by"].as_str().expect("owned_by");
        let expected = if m["id"] == "passing-model" {
            "acme-labs"
        } else {
            "modelgate"
        };
        assert_eq!(owner, expected, "{m}");
    }
    let one: serde_json::Value = get(&g.main, "/v1/models/echo-1", Some(KEY))
        .await
        .json()
        .await
        .expect("model");
    assert_eq!(one["owned_by"], "modelgate", "never the pool's name: {one}");
}
