//! Shutdowns that lose nothing: SIGTERM lets requests finish within the grace period, ends the
//! rest with a record each, and exits as soon as nothing is in flight.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_gateway_exits_at_once_on_sigterm() {
    let mut g = start_with(Setup {
        grace_seconds: 30,
        ..Setup::default()
    });
    assert_eq!(get(&g.main, "/v1/models", Some(KEY)).await.status(), 200);
    let started = Instant::now();
    let status = tokio::task::block_in_place(|| g.terminate());
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_longer_than_the_grace_period_are_cut_and_each_leaves_a_record() {
    let mut g = start_with(Setup {
        grace_seconds: 1,
        ..Setup::default()
    });
    let n = 10;
    let c = client();
    let mut streams = Vec::new();
    for _ in 0..n {
        // 100 events 200 ms apart: 20 s, far past the grace period.
        let resp = c
            .post(format!("{}/v1/chat/completions", g.direct))
            .bearer_auth(KEY)
            .header("x-mock-chunks", "100")
            .header("x-mock-delay-ms", "200")
            .json(&chat_body("echo-1", true))
            .send()
            .await
            .expect("stream starts");
        assert_eq!(resp.status(), 200);
        streams.push(tokio::spawn(async move {
            let mut resp = resp;
            let mut got = 0usize;
            loop {
                match resp.chunk().await {
                    Ok(Some(b)) => got += b.len(),
                    // A clean end would mean the cut went unseen.
                    Ok(None) => return (got, false),
                    Err(_) => return (got, true),
                }
            }
        }));
    }
    let started = Instant::now();
    let status = tokio::task::block_in_place(|| g.terminate());
    let took = started.elapsed();
    assert!(status.success(), "{status}");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    for s in streams {
        let (got, cut) = s.await.expect("task");
        assert!(got > 0 && cut, "got {got} bytes, cut {cut}");
    }
    let g = g.restart_stopped();
    let page: serde_json::Value = get(&g.direct, "/api/usage?limit=100", Some(KEY))
        .await
        .json()
        .await
        .expect("json");
    let records = page["data"].as_array().expect("data");
    assert_eq!(records.len(), n, "{page}");
    for r in records {
        assert_eq!(r["status"], 503, "{r}");
        assert!(
            r["completion_tokens"].as_u64() > Some(0),
            "tokens so far: {r}"
        );
        assert_eq!(r["stream"], json!(true));
    }
}
