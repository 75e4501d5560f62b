//! The access log: one JSON line per request (refused ones included) to stdout or
//! `[log] access_file`, apart from the gateway's own log on stderr, with the record's fields,
//! the client's address, user agent and trace id, and never a secret; logfmt and sampling by
//! config.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// A gateway whose access log goes to `access.log` beside its config, with `extra` in `[log]`.
fn logging_to_a_file(extra: &str) -> Gateway {
    start_with(Setup {
        extra_config: format!("[log]\naccess_file = \"access.log\"\n{extra}"),
        ..Setup::default()
    })
}

/// The access log file's text once it has `n` lines (up to 10 s).
fn await_lines(g: &Gateway, n: usize) -> String {
    let path = g.dir.path().join("access.log");
    eventually(
        Duration::from_secs(10),
        &format!("fewer than {n} access log lines"),
        || {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() >= n {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
}

fn access_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "access")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_one_json_line_with_its_record_and_no_secret() {
    let g = logging_to_a_file("");
    let ok = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", false),
        &[
            ("user-agent", "OpenAI/Python 1.99.0"),
            // The mock answers as a provider does, with a request id of its own.
            ("x-mock-provider-headers", "1"),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        ],
    )
    .await;
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
    let text = tokio::task::block_in_place(|| await_lines(&g, 3));
    let (status, stderr) = tokio::task::block_in_place(|| g.terminate_and_stderr());
    assert!(status.success());
    // Every line of the file is JSON (`jq` reads it whole); none is on stderr.
    let lines = access_lines(&text);
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(access_lines(&stderr).is_empty(), "{stderr}");
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
    assert_eq!(
        (
            l["client"].as_str(),
            l["user_agent"].as_str(),
            l["trace_id"].as_str()
        ),
        (
            Some("127.0.0.1"),
            Some("OpenAI/Python 1.99.0"),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        ),
        "{l}"
    );
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
    // The upstream's own request id (the mock's `req_mock…`), as the client got it.
    assert_eq!(
        l["upstream_request_id"].as_str(),
        ok.headers()
            .get("x-upstream-request-id")
            .and_then(|v| v.to_str().ok())
    );
    assert!(
        l["upstream_request_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("req_mock")),
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
    assert!(r["trace_id"].as_str().is_some_and(|t| t.len() == 32), "{r}");
    for secret in [KEY, "sk-wrong-key-1234567890", POOL_KEY] {
        assert!(!stderr.contains(secret), "a secret in the log");
        assert!(!text.contains(secret), "a secret in the access log");
    }
    // Lines are plain: no terminal colours when stderr is not a terminal.
    assert!(!stderr.contains('\u{1b}'), "ANSI escapes in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logfmt_and_off_are_honoured() {
    let g = logging_to_a_file("format = \"logfmt\"\n");
    assert_eq!(
        post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false))
            .await
            .status(),
        200
    );
    let text = tokio::task::block_in_place(|| await_lines(&g, 1));
    let line = text
        .lines()
        .find(|l| l.contains("type=access"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(" status=200 ") && line.contains(" key_id=full "),
        "{line}"
    );

    let g = logging_to_a_file("access = \"off\"\n");
    let r = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    assert_eq!(r.status(), 200);
    await_record(&g, &request_id(&r)).await;
    let text = std::fs::read_to_string(g.dir.path().join("access.log")).unwrap_or_default();
    let (_, stderr) = tokio::task::block_in_place(|| g.terminate_and_stderr());
    assert!(text.is_empty(), "{text}");
    assert!(
        access_lines(&stderr).is_empty() && !stderr.contains("type=access"),
        "{stderr}"
    );
}

/// A chat request's status.
async fn chat(g: &Gateway) -> u16 {
    post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false))
        .await
        .status()
        .as_u16()
}

/// Lines in `name` beside the config.
fn lines_in(g: &Gateway, name: &str) -> usize {
    std::fs::read_to_string(g.dir.path().join(name))
        .unwrap_or_default()
        .lines()
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_file_is_followed_after_a_rename_and_on_sigusr1() {
    let mut g = logging_to_a_file("");
    assert_eq!(chat(&g).await, 200);
    tokio::task::block_in_place(|| await_lines(&g, 1));
    // logrotate's default: rename, and the gateway notices the path names no file it has open.
    let dir = g.dir.path().to_path_buf();
    std::fs::rename(dir.join("access.log"), dir.join("access.log.1")).expect("rename");
    let mut sent = 1;
    // One 10 s deadline for both waits.
    let deadline = Instant::now() + Duration::from_secs(10);
    let chat_until_a_new_file = async |sent: &mut usize| {
        if lines_in(&g, "access.log") > 0 {
            return Ok(());
        }
        assert_eq!(chat(&g).await, 200);
        *sent += 1;
        Err(String::new())
    };
    eventually_async(
        Duration::from_secs(10),
        "no new access.log after a rename",
        async || chat_until_a_new_file(&mut sent).await,
    )
    .await;
    // SIGUSR1 (as logrotate's postrotate sends): reopened at once; the gateway goes on.
    std::fs::rename(dir.join("access.log"), dir.join("access.log.2")).expect("rename");
    g.send_signal("-USR1");
    eventually_async(
        deadline.saturating_duration_since(Instant::now()),
        "no new access.log after SIGUSR1",
        async || chat_until_a_new_file(&mut sent).await,
    )
    .await;
    assert!(g.running(), "SIGUSR1 ended the gateway");
    // Nothing was dropped, and the count is on /metrics.
    let metrics = metrics_text(&g).await;
    assert!(
        metrics.contains("modelgate_access_log_lines_dropped_total 0"),
        "{metrics}"
    );
    let status = tokio::task::block_in_place(|| g.terminate());
    assert!(status.success());
    // No line lost or doubled across the three files.
    let total: usize = ["access.log", "access.log.1", "access.log.2"]
        .iter()
        .map(|f| lines_in(&g, f))
        .sum();
    assert_eq!(total, sent);
}
