//! Replies of any size and coding are metered: a plain reply over 16 MiB from its tail (where
//! its `usage` is), and a reply an upstream compressed although the gateway asked for
//! `identity`, decoded for the meter only (the client gets the bytes as they came).

mod common;

use std::io::Read;

use common::{KEY, Setup, send, start_with};
use serde_json::Value;

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("gzip");
    out
}

fn tokens(v: &Value) -> (Option<u64>, Option<u64>) {
    (v["prompt_tokens"].as_u64(), v["completion_tokens"].as_u64())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plain_reply_over_16_mib_is_metered_from_its_tail() {
    let g = start_with(Setup::default());
    let r = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &common::chat_body("echo-1", false),
        &[("x-mock-pad-bytes", "17825792")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let id = common::request_id(&r);
    let body = r.bytes().await.expect("body");
    assert!(body.len() > 17_000_000, "{}", body.len());
    let reply: Value = serde_json::from_slice(&body).expect("json");
    let rec = common::await_record(&g, &id).await;
    assert_eq!(tokens(&rec), tokens(&reply["usage"]), "{rec}");
    assert!(rec["completion_tokens"].as_u64() > Some(0), "{rec}");
    assert_eq!(rec["estimated"], false, "{rec}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compressed_reply_passes_as_it_came_unless_edited_and_is_metered() {
    let g = start_with(Setup::default());
    // Plain.
    let r = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &common::chat_body("echo-1", false),
        &[("x-mock-gzip", "1")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let id = common::request_id(&r);
    let reply: Value =
        serde_json::from_slice(&gunzip(&r.bytes().await.expect("body"))).expect("json");
    let rec = common::await_record(&g, &id).await;
    assert_eq!(tokens(&rec), tokens(&reply["usage"]), "{rec}");
    assert!(rec["prompt_tokens"].as_u64() > Some(0), "{rec}");
    assert_eq!(rec["estimated"], false, "{rec}");
    // Streamed, its usage asked for.
    let mut body = common::chat_body("echo-1", true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let r = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &body,
        &[("x-mock-gzip", "1"), ("x-mock-chunks", "12")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let id = common::request_id(&r);
    let text = String::from_utf8(gunzip(&r.bytes().await.expect("body"))).expect("utf-8");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let usage: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .map(|v| v["usage"].clone())
        .expect("a usage event");
    let rec = common::await_record(&g, &id).await;
    assert_eq!(tokens(&rec), tokens(&usage), "{rec}");
    assert!(rec["completion_tokens"].as_u64() > Some(0), "{rec}");
    assert_eq!(rec["estimated"], false, "{rec}");
    // Streamed, its usage not asked for: the gateway asks, and strips the usage event from
    // the events it passes on, which therefore go on decoded.
    let r = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &common::chat_body("echo-1", true),
        &[("x-mock-gzip", "1"), ("x-mock-chunks", "12")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("content-encoding").is_none());
    let id = common::request_id(&r);
    let text = r.text().await.expect("body");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let words = text.matches(r#""content":""#).count() - text.matches(r#""content":"""#).count();
    assert_eq!(words, 12, "{text}");
    assert!(!text.contains(r#""usage":{"#), "{text}");
    let rec = common::await_record(&g, &id).await;
    assert_eq!(rec["completion_tokens"], 12, "{rec}");
    assert_eq!(rec["estimated"], false, "{rec}");
}
