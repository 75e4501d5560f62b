//! No client key and no upstream credential in any log line at any level, Pingora's own
//! output included: a session at RUST_LOG=trace, grepped.

mod common;

use std::io::{Read, Write};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_level_session_logs_no_key_and_no_upstream_credential() {
    let g = start_with(Setup {
        env: vec![("RUST_LOG".into(), "trace".into())],
        extra_config: r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "anthropic-like"
upstreams = ["http://127.0.0.1:@MOCK@"]
api_key = "sk-ant-pool-credential-7788"
auth_header = "x-api-key"

[[models]]
name = "claude-like"
pool = "anthropic-like"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    for base in g.bases() {
        assert_eq!(
            post_json(&base, "/v1/chat/completions", &chat_body("echo-1", false))
                .await
                .status(),
            200
        );
        let stream = post_json(&base, "/v1/chat/completions", &chat_body("echo-1", true)).await;
        let _ = stream.bytes().await;
        let _ = send(
            &base,
            "/v1/chat/completions",
            Some("sk-wrong-but-secret-123456"),
            &chat_body("echo-1", false),
            &[],
        )
        .await;
        let _ = post_json(
            &base,
            "/v1/chat/completions",
            &chat_body("gone-model", false),
        )
        .await;
        let _ = get(&base, "/api/usage", Some(KEY)).await;
        // Anthropic's way: the key in x-api-key, and a pool whose credential goes there too.
        let body = serde_json::json!({"model": "claude-like", "max_tokens": 8, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]});
        let resp = client()
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), 200);
        let _ = resp.bytes().await;
    }
    // A request Pingora cannot parse, carrying a key.
    let addr = g.main.trim_start_matches("http://").to_string();
    tokio::task::block_in_place(|| {
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        let raw = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: abc\r\nBad Header\r\n\r\n"
        );
        let _ = s.write_all(raw.as_bytes());
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
    });
    let (_, stderr) = tokio::task::block_in_place(|| g.terminate_and_stderr());
    assert!(
        stderr.len() > 1_000,
        "trace output expected: {} bytes",
        stderr.len()
    );
    for secret in [
        KEY,
        "sk-wrong-but-secret-123456",
        POOL_KEY,
        "sk-ant-pool-credential-7788",
    ] {
        let hits: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains(secret))
            .take(3)
            .collect();
        assert!(hits.is_empty(), "{secret} in the log:\n{}", hits.join("\n"));
    }
}
