//! Request bodies of any framing and size up to the limit reach the upstream byte-exact;
//! larger ones get 413. Never a hang.

mod common;

use common::*;
use futures_util::stream;

/// A valid chat body of about `size` bytes (a long user message).
fn big_chat(size: usize) -> Vec<u8> {
    let filler = "x".repeat(size);
    serde_json::to_vec(
        &serde_json::json!({"model": "echo-1", "messages": [{"role": "user", "content": filler}]}),
    )
    .expect("json")
}

async fn send(base: &str, body: Vec<u8>, chunked: bool) -> reqwest::Response {
    let req = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("content-type", "application/json");
    let req = if chunked {
        // A stream body has no known length: reqwest sends it chunked, in 16 KiB pieces.
        let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
            body.chunks(16 * 1024).map(|c| Ok(c.to_vec())).collect();
        req.body(reqwest::Body::wrap_stream(stream::iter(pieces)))
    } else {
        req.body(body)
    };
    req.send().await.expect("send")
}

/// 60 KiB goes up in one write with its header, 65 KiB and more after it (the 64 KiB line).
#[tokio::test]
async fn bodies_of_every_size_and_framing_arrive_byte_exact() {
    let g = start();
    for size in [10, 60 * 1024, 65 * 1024, 300 * 1024, 3 * 1024 * 1024] {
        for chunked in [false, true] {
            for base in g.bases() {
                let body = big_chat(size);
                let want = sha256_hex(&body);
                let resp = send(&base, body.clone(), chunked).await;
                assert_eq!(resp.status(), 200, "size {size} chunked {chunked} {base}");
                assert_eq!(
                    resp.headers()["x-mock-body-sha256"],
                    want.as_str(),
                    "size {size} chunked {chunked}"
                );
                assert_eq!(
                    resp.headers()["x-mock-body-len"],
                    body.len().to_string().as_str()
                );
                let v: serde_json::Value = resp.json().await.expect("json");
                assert_eq!(v["choices"][0]["message"]["content"], MOCK_TEXT);
            }
        }
    }
}

/// A request whose `Connection` header says more than keep-alive goes up the way Pingora sends
/// it (header, then body) instead of in one write: `close` still gets the whole reply, the body
/// byte-exact, one record, and the connection ends; the next request is served as usual.
#[tokio::test]
async fn a_client_asking_to_close_gets_its_reply_and_the_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    let body = big_chat(10);
    let mut s = raw_connect(&g.main).await;
    let head = chat_head(KEY, body.len(), "Connection: close\r\n");
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(&body).await.expect("body");
    let mut reply = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_end(&mut reply),
    )
    .await
    .expect("the connection ends")
    .expect("read");
    let text = String::from_utf8_lossy(&reply);
    let lower = text.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 200"), "{text}");
    assert!(
        lower.contains(&format!("x-mock-body-sha256: {}", sha256_hex(&body))),
        "{text}"
    );
    assert!(text.contains(MOCK_TEXT), "{text}");
    let id = request_id_in(&text);
    let record = await_record(&g, &id).await;
    assert_eq!(record["status"], 200, "{record}");
    let resp = send(&g.main, big_chat(10), false).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_rewritten_body_gets_an_exact_length() {
    let g = start();
    let body = serde_json::to_vec(&serde_json::json!({"model": "big-model", "messages": [{"role": "user", "content": "y".repeat(200_000)}]})).expect("json");
    for chunked in [false, true] {
        let resp = send(&g.main, body.clone(), chunked).await;
        assert_eq!(resp.status(), 200);
        let expected_len = body.len() - "big-model".len() + "upstream/big-model-v2".len();
        assert_eq!(
            resp.headers()["x-mock-body-len"],
            expected_len.to_string().as_str()
        );
        assert_eq!(resp.headers()["x-mock-model"], "upstream/big-model-v2");
    }
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_with_either_framing() {
    let g = start_with(Setup {
        max_body_bytes: 100_000,
        ..Setup::default()
    });
    for chunked in [false, true] {
        let resp = send(&g.direct, big_chat(150_000), chunked).await;
        let (status, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (413, Some("request_too_large")),
            "chunked {chunked}"
        );
    }
    // Just under the limit still works.
    let resp = send(&g.direct, big_chat(90_000), true).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refused_mid_upload_reads_its_answer_instead_of_a_reset() {
    // Bodies far over the socket buffers, eight clients at a time: the gateway answers before
    // they are sent, then reads and drops the rest so each client can finish its upload and
    // read the answer.
    let g = start_with(Setup {
        max_body_bytes: 1 << 20,
        // Wrong keys are part of the test: no throttle for them.
        limits_extra: "auth_failures_per_minute = 0".into(),
        ..Setup::default()
    });
    let body = big_chat(3 << 20);
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..8 {
        let (base, body) = (g.main.clone(), body.clone());
        tasks.spawn(async move {
            for round in 0..5 {
                let chunked = (t + round) % 2 == 0;
                let resp = send(&base, body.clone(), chunked).await;
                let (status, e) = error_of(resp).await;
                assert_eq!(
                    (status, e["code"].as_str()),
                    (413, Some("request_too_large")),
                    "client {t}, round {round}, chunked {chunked}"
                );
                let resp = client()
                    .post(format!("{base}/v1/chat/completions"))
                    .bearer_auth("sk-not-a-key")
                    .header("content-type", "application/json")
                    .body(body[..(2 << 20)].to_vec())
                    .send()
                    .await
                    .expect("the refusal is read, not reset");
                assert_eq!(resp.status(), 401, "client {t}, round {round}");
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("client");
    }
}

/// A streamed chat body of about `size` bytes for `model`.
fn big_stream(model: &str, size: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": model, "stream": true,
        "messages": [{"role": "user", "content": "x".repeat(size)}]
    }))
    .expect("json")
}

/// One forwarding path: whatever the body's framing and size, a stream the upstream cuts is
/// cut for the client too (no clean end) and recorded as 502, and a dead upstream is 502
/// `upstream_error`.
#[tokio::test]
async fn every_framing_sees_the_same_cut_stream_and_the_same_dead_upstream() {
    let g = start();
    for (size, chunked) in [(100, false), (100, true), (200_000, false), (200_000, true)] {
        let pieces: Vec<Result<Vec<u8>, std::io::Error>> = big_stream("echo-1", size)
            .chunks(16 * 1024)
            .map(|c| Ok(c.to_vec()))
            .collect();
        let req = client()
            .post(format!("{}/v1/chat/completions", g.direct))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .header("x-mock-cut-after", "2")
            .header("x-mock-chunks", "20");
        let req = if chunked {
            req.body(reqwest::Body::wrap_stream(stream::iter(pieces)))
        } else {
            req.body(big_stream("echo-1", size))
        };
        let mut resp = req.send().await.expect("send");
        assert_eq!(resp.status(), 200, "{size} {chunked}");
        let id = request_id(&resp);
        let clean_end = loop {
            match resp.chunk().await {
                Ok(Some(_)) => {}
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        assert!(
            !clean_end,
            "a cut stream ended cleanly: size {size} chunked {chunked}"
        );
        let r = await_record(&g, &id).await;
        assert_eq!(r["status"], 502, "size {size} chunked {chunked}: {r}");

        let dead = big_stream("gone-model", size);
        let resp = send(&g.main, dead, chunked).await;
        let (status, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (502, Some("upstream_error")),
            "dead upstream, size {size} chunked {chunked}: {e}"
        );
    }
}

/// A compressed body cannot be read for its model: a clear 400 naming the header. A body
/// declared over the limit gets its 413 before a `100 Continue` would invite it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_body_is_refused_clearly_and_an_oversized_one_before_its_100_continue() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start_with(Setup {
        max_body_bytes: 1000,
        ..Setup::default()
    });
    let resp = client()
        .post(format!("{}/v1/chat/completions", g.main))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3])
        .send()
        .await
        .expect("send");
    let (status, e) = error_of(resp).await;
    assert_eq!(
        (status, e["param"].as_str()),
        (400, Some("content-encoding")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap_or("").contains("gzip"), "{e}");

    // Every Content-Encoding header counts: `identity` then `gzip` is gzip to the upstream.
    let body = serde_json::to_vec(&chat_body("echo-1", false)).expect("json");
    let mut s = raw_connect(&g.main).await;
    let head = chat_head(
        KEY,
        body.len(),
        "Content-Encoding: identity\r\nContent-Encoding: gzip\r\nConnection: close\r\n",
    );
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(&body).await.expect("body");
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).await.expect("read");
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains("content-encoding"), "{reply}");

    let mut s = raw_connect(&g.main).await;
    let head = chat_head(KEY, 5_000, "Expect: 100-continue\r\n");
    s.write_all(head.as_bytes()).await.expect("head");
    let mut reply = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut reply))
        .await
        .expect("answered at once")
        .expect("read");
    let reply = String::from_utf8_lossy(&reply[..n]);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
}
