//! The access log: one JSON line per request on stderr (refused ones included), with the
//! record's fields and never a secret; logfmt and sampling by config.

mod common;

use common::*;

fn access_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "access")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_one_json_line_with_its_record_and_no_secret() {
    let g = start();
    let ok = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    assert_eq!(ok.status(), 200);
    let ok_id = request_id(&ok);
    let stream = post_json(
        &g.direct,
        "/v1/chat/completions",
        &chat_body("echo-1", true),
    )
    .await;
    let stream_id = request_id(&stream);
    let _ = stream.bytes().await;
    let refused = send(
        &g.main,
        "/v1/chat/completions",
        Some("sk-wrong-key-1234567890"),
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    assert_eq!(refused.status(), 401);
    let refused_id = request_id(&refused);
    let (status, stderr) = tokio::task::block_in_place(|| g.terminate_and_stderr());
    assert!(status.success());
    let lines = access_lines(&stderr);
    assert_eq!(lines.len(), 3, "{stderr}");
    let by_id = |id: &str| {
        lines
            .iter()
            .find(|l| l["request_id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no line for {id}: {stderr}"))
    };
    let l = by_id(&ok_id);
    assert_eq!(
        (
            l["listener"].as_str(),
            l["method"].as_str(),
            l["path"].as_str(),
            l["status"].as_u64()
        ),
        (
            Some("main"),
            Some("POST"),
            Some("/v1/chat/completions"),
            Some(200)
        )
    );
    assert_eq!(l["key_id"], "full", "{l}");
    assert!(
        l["total_tokens"].as_u64() > Some(0) && l["attempts"] == 1,
        "{l}"
    );
    assert!(
        l["upstream"]
            .as_str()
            .is_some_and(|u| u.starts_with("http://127.0.0.1:")),
        "{l}"
    );
    let s = by_id(&stream_id);
    assert_eq!(
        (s["stream"].as_bool(), s["listener"].as_str()),
        (Some(true), Some("direct"))
    );
    assert!(s["ttft_ms"].is_u64(), "{s}");
    let r = by_id(&refused_id);
    assert_eq!(
        (r["status"].as_u64(), r["key_id"].as_str()),
        (Some(401), Some(""))
    );
    for secret in [KEY, "sk-wrong-key-1234567890", POOL_KEY] {
        assert!(!stderr.contains(secret), "a secret in the log");
    }
    // Lines are plain: no terminal colours when stderr is not a terminal.
    assert!(!stderr.contains('\u{1b}'), "ANSI escapes in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logfmt_and_off_are_honoured() {
    let g = start_with(Setup {
        extra_config: "[log]\nformat = \"logfmt\"\n".into(),
        ..Setup::default()
    });
    assert_eq!(
        post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false))
            .await
            .status(),
        200
    );
    let (_, stderr) = tokio::task::block_in_place(|| g.terminate_and_stderr());
    let line = stderr
        .lines()
        .find(|l| l.contains("type=access"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.contains(" status=200 ") && line.contains(" key_id=full "),
        "{line}"
    );

    let g = start_with(Setup {
        extra_config: "[log]\naccess = \"off\"\n".into(),
        ..Setup::default()
    });
    assert_eq!(
        post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false))
            .await
            .status(),
        200
    );
    let (_, stderr) = tokio::task::block_in_place(|| g.terminate_and_stderr());
    assert!(
        access_lines(&stderr).is_empty() && !stderr.contains("type=access"),
        "{stderr}"
    );
}
