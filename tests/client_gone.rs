//! Work done is billed: a client that leaves after its request went upstream. By default
//! (`[server] on_client_gone = "finish"`) the gateway reads the upstream's reply to its end,
//! unsent, and records its real usage (status 499, `cut = "client"`); with `"cancel"` it drops
//! the upstream at once and bills the prompt, estimated.

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, KEY, Setup, start_with};
use serde_json::Value;

/// The chat records (newest first) once `n` of them with status 499 are there.
async fn await_left(g: &Gateway, n: usize) -> Vec<Value> {
    common::eventually_async(
        Duration::from_secs(15),
        &format!("fewer than {n} records of 499"),
        async || {
            let page: Value = common::get(&g.direct, "/api/usage?limit=100&order=desc", Some(KEY))
                .await
                .json()
                .await
                .expect("json");
            let left: Vec<Value> = page["data"]
                .as_array()
                .expect("data")
                .iter()
                .filter(|r| r["endpoint"] == "chat" && r["status"] == 499)
                .cloned()
                .collect();
            if left.len() >= n {
                Ok(left)
            } else {
                Err(format!("{} of {n} records", left.len()))
            }
        },
    )
    .await
}

/// A chat request the client gives up on after `patience` (before the reply header).
async fn leave_before_the_header(g: &Gateway, stream: bool, delay_ms: &str) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let r = client
        .post(format!("{}/v1/chat/completions", g.main))
        .bearer_auth(KEY)
        .header("x-mock-delay-ms", delay_ms)
        .json(&common::chat_body("priced-model", stream))
        .send()
        .await;
    assert!(r.is_err(), "the client gave up first");
}

/// A stream the client leaves after its first piece; its request id.
async fn leave_a_stream(g: &Gateway) -> String {
    let r = common::send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &common::chat_body("priced-model", true),
        &[("x-mock-chunks", "30"), ("x-mock-delay-ms", "20")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let id = common::request_id(&r);
    let mut body = r.bytes_stream();
    let first = futures_util::StreamExt::next(&mut body).await;
    assert!(first.is_some_and(|p| p.is_ok()));
    drop(body);
    id
}

/// The tokens of a whole stream like `leave_a_stream`'s.
async fn whole_stream_tokens(g: &Gateway) -> (u64, u64) {
    let r = common::send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &common::chat_body("priced-model", true),
        &[("x-mock-chunks", "30")],
    )
    .await;
    let id = common::request_id(&r);
    r.bytes().await.expect("whole");
    let rec = common::await_record(g, &id).await;
    let tokens = |f: &str| rec[f].as_u64().expect("tokens");
    (tokens("prompt_tokens"), tokens("completion_tokens"))
}

#[tokio::test(flavor = "multi_thread")]
async fn by_default_a_client_that_leaves_is_billed_for_the_whole_reply() {
    let g = start_with(Setup::default());
    let (prompt, completion) = whole_stream_tokens(&g).await;
    assert!(prompt > 0 && completion > 0);
    // Gone before the header: the reply is read for its usage all the same.
    leave_before_the_header(&g, false, "900").await;
    let before = await_left(&g, 1).await.remove(0);
    assert_eq!(before["cut"], "client", "{before}");
    assert_eq!(before["estimated"], false, "{before}");
    assert!(before["prompt_tokens"].as_u64() > Some(0), "{before}");
    assert!(before["completion_tokens"].as_u64() > Some(0), "{before}");
    assert!(before["cost"].as_f64() > Some(0.0), "{before}");
    assert!(before["latency_ms"].as_u64() >= Some(900), "{before}");
    // Gone mid-stream: the stream's own usage, as if it had been read whole.
    let id = leave_a_stream(&g).await;
    let mid = common::await_record(&g, &id).await;
    assert_eq!(
        (mid["status"].as_u64(), mid["cut"].as_str()),
        (Some(499), Some("client")),
        "{mid}"
    );
    assert_eq!(mid["estimated"], false, "{mid}");
    assert_eq!(
        (
            mid["prompt_tokens"].as_u64(),
            mid["completion_tokens"].as_u64()
        ),
        (Some(prompt), Some(completion)),
        "{mid}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_cancel_a_client_that_leaves_is_billed_its_prompt_estimated() {
    let g = start_with(Setup {
        server_extra: "on_client_gone = \"cancel\"".into(),
        ..Setup::default()
    });
    let started = Instant::now();
    leave_before_the_header(&g, false, "3000").await;
    let r = await_left(&g, 1).await.remove(0);
    // The upstream was dropped, not waited for.
    assert!(started.elapsed() < Duration::from_millis(2_500));
    assert_eq!(r["cut"], "client", "{r}");
    assert_eq!(r["estimated"], true, "{r}");
    assert!(r["prompt_tokens"].as_u64() > Some(0), "{r}");
    assert_eq!(r["completion_tokens"].as_u64(), Some(0), "{r}");
    assert!(r["cost"].as_f64() > Some(0.0), "{r}");
    // Mid-stream: what passed is counted, estimated.
    let id = leave_a_stream(&g).await;
    let mid = common::await_record(&g, &id).await;
    assert_eq!(mid["status"].as_u64(), Some(499), "{mid}");
    assert_eq!(mid["estimated"], true, "{mid}");
}

/// Unsent, a stream is read within the pool's `request_timeout` from the client's leaving: an
/// upstream that would go on long after is let go, and what it sent is billed. A client that
/// reads gets the whole stream, past that timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_left_unsent_is_read_within_the_pools_request_timeout() {
    let g = start_with(Setup {
        extra_config: r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "brief"
upstreams = ["http://127.0.0.1:@MOCK@"]
request_timeout_ms = 1000

[[models]]
name = "brief-model"
pool = "brief"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    // A client that reads is sent the whole stream, however long past `request_timeout`.
    let r = common::send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &common::chat_body("brief-model", true),
        &[("x-mock-chunks", "30"), ("x-mock-delay-ms", "50")],
    )
    .await;
    let id = common::request_id(&r);
    let text = r.text().await.expect("stream");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let whole = common::await_record(&g, &id).await;
    assert_eq!(
        (whole["status"].as_u64(), whole["cut"].as_str()),
        (Some(200), Some("")),
        "{whole}"
    );
    let r = common::send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &common::chat_body("brief-model", true),
        &[("x-mock-chunks", "200"), ("x-mock-delay-ms", "50")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let id = common::request_id(&r);
    let left = Instant::now();
    let mut body = r.bytes_stream();
    let first = futures_util::StreamExt::next(&mut body).await;
    assert!(first.is_some_and(|p| p.is_ok()));
    drop(body);
    let rec = common::await_record(&g, &id).await;
    // 200 chunks 50 ms apart would take 10 s.
    assert!(
        left.elapsed() < Duration::from_secs(5),
        "{:?}",
        left.elapsed()
    );
    assert_eq!(
        (rec["status"].as_u64(), rec["cut"].as_str()),
        (Some(499), Some("client")),
        "{rec}"
    );
    let completion = rec["completion_tokens"].as_u64().expect("tokens");
    assert!(completion > 5 && completion < 200, "{rec}");
}
