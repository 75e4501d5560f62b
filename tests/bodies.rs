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
