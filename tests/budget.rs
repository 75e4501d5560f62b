//! Budgets and tpm as caps (`budget_mode = "reserve"`, the default): a request's worst cost is
//! held at admission, its output limit lowered to what the budget can pay, and settled at its
//! end; concurrent clients and long streams never spend past the budget, and a stream whose
//! upstream ignores the lowered limit is cut with an error event in its API's framing.
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Gateway, Setup, client, send, start_with};
use serde_json::{Value, json};

/// 0.001 a token, prompt and output alike.
const MODELS: &str = r#"
[[models]]
name = "metered"
pool = "local"
upstream_model = "echo-1"
price = { prompt = 1000.0, completion = 1000.0, request = 0.0 }

[[models]]
name = "wordy"
pool = "local"
upstream_model = "echo-1"
max_output_tokens = 300
price = { prompt = 1000.0, completion = 1000.0, request = 0.0 }
"#;

const KEYS: &str = r#"
[[keys]]
id = "capped"
secret = "sk-test-capped-0101"
budget = 1.0

[[keys]]
id = "streamer"
secret = "sk-test-streamer-0102"
budget = 1.0

[[keys]]
id = "cut"
secret = "sk-test-cut-0103"
budget = 1.0

[[keys]]
id = "window"
secret = "sk-test-window-0104"
tpm = 1000

[[keys]]
id = "cut-gzip"
secret = "sk-test-cut-gzip-0106"
budget = 1.0

[[keys]]
id = "mixed"
secret = "sk-test-mixed-0107"
budget = 1.0

[[keys]]
id = "roomy"
secret = "sk-test-roomy-0105"
budget = 1000.0
"#;

fn start() -> Gateway {
    start_with(Setup {
        extra_config: MODELS.into(),
        extra_keys: KEYS.into(),
        ..Setup::default()
    })
}

/// The key's records (but those of its usage calls), once there are `n` of them.
async fn records(g: &Gateway, key: &str, n: usize) -> Vec<Value> {
    common::eventually_async(
        Duration::from_secs(10),
        &format!("fewer than {n} records"),
        async || {
            // The usage calls that read them have records of their own: not counted.
            let data: Vec<Value> = common::all_records(&g.direct, key)
                .await
                .into_iter()
                .filter(|r| r["endpoint"] != "usage")
                .collect();
            if data.len() >= n {
                Ok(data)
            } else {
                Err(format!("{} of {n} records", data.len()))
            }
        },
    )
    .await
}

/// Sends until the budget refuses (402); a 429 (the rest held by requests in flight) is
/// retried after a pause. Returns (served, requests sent).
async fn until_spent(base: String, key: &'static str, body: Value) -> (u64, u64) {
    until_spent_with(base, key, body, &[], None).await
}

/// `until_spent`, each request with `headers` (the mock's); `served` is set once one is.
async fn until_spent_with(
    base: String,
    key: &'static str,
    body: Value,
    headers: &'static [(&'static str, &'static str)],
    served_one: Option<Arc<AtomicBool>>,
) -> (u64, u64) {
    let (mut served, mut sent) = (0, 0);
    loop {
        let r = send(&base, "/v1/chat/completions", Some(key), &body, headers).await;
        sent += 1;
        match r.status().as_u16() {
            200 => {
                served += 1;
                if let Some(flag) = &served_one {
                    flag.store(true, Ordering::SeqCst);
                }
                r.bytes().await.expect("body");
            }
            429 => {
                assert_eq!(r.headers()["retry-after"], "1");
                let e: Value = r.json().await.expect("json");
                assert_eq!(e["error"]["code"], "rate_limit_exceeded", "{e}");
                tokio::time::sleep(Duration::from_millis(20 + sent % 30)).await;
            }
            402 => return (served, sent),
            s => panic!("status {s}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_concurrent_clients_use_the_budget_and_never_pass_it() {
    let g = start();
    let key = "sk-test-capped-0101";
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let base = [&g.main, &g.direct][i % 2].clone();
            // Half the clients name a small output limit, the rest leave it to the model's.
            let mut body = common::chat_body("metered", false);
            if i % 2 == 0 {
                body["max_tokens"] = json!(20);
            }
            tokio::spawn(until_spent(base, key, body))
        })
        .collect();
    let (mut served, mut sent) = (0, 0);
    for t in tasks {
        let (s, n) = t.await.expect("task");
        served += s;
        sent += n;
    }
    let all = records(&g, key, sent as usize).await;
    let billed: f64 = all.iter().map(|r| r["cost"].as_f64().unwrap_or(0.0)).sum();
    let spent = common::spend_of(&g, key).await;
    assert!(
        (billed - spent).abs() < 1e-9,
        "records {billed}, spend {spent}"
    );
    // A chat costs 0.012 (4 prompt and 8 output tokens): about 80 fit in 1.0.
    assert!(
        spent <= 1.0 + 1e-9,
        "spent {spent} of 1.0 in {served} replies"
    );
    assert!(
        spent >= 0.95,
        "the budget was used: {spent} in {served} replies"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn long_streams_are_lowered_to_what_the_budget_pays() {
    let g = start();
    let key = "sk-test-streamer-0102";
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let base = g.main.clone();
            tokio::spawn(async move {
                let body = common::chat_body("metered", true);
                let mut lowered = 0;
                loop {
                    let r = send(
                        &base,
                        "/v1/chat/completions",
                        Some(key),
                        &body,
                        &[("x-mock-chunks", "5000")],
                    )
                    .await;
                    match r.status().as_u16() {
                        200 => {
                            let limited = r.headers().get("x-modelgate-budget-limited").is_some();
                            let text = r.text().await.expect("stream");
                            assert!(text.ends_with("data: [DONE]\n\n"));
                            if limited {
                                lowered += 1;
                                assert!(text.contains(r#""finish_reason":"length""#));
                            }
                        }
                        429 => tokio::time::sleep(Duration::from_millis(25)).await,
                        402 => return lowered,
                        s => panic!("status {s}"),
                    }
                }
            })
        })
        .collect();
    let mut lowered = 0;
    for t in tasks {
        lowered += t.await.expect("task");
    }
    // 5,000 tokens (5.0) asked each time: every stream served was lowered.
    assert!(lowered >= 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    let spent = loop {
        let s = common::spend_of(&g, key).await;
        if s > 0.9 || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(spent <= 1.0 + 1e-9, "spent {spent} of 1.0");
    assert!(spent >= 0.9, "the budget was used: {spent}");
}

/// Reads a stream whole; returns its text.
async fn stream_text(g: &Gateway, key: &str, path: &str, body: &Value) -> (String, String) {
    let r = send(
        &g.main,
        path,
        Some(key),
        body,
        &[("x-mock-chunks", "5000"), ("x-mock-ignore-max-tokens", "1")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-modelgate-budget-limited"], "true");
    let id = common::request_id(&r);
    (id, r.text().await.expect("stream"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_whose_upstream_ignores_the_limit_is_cut_at_the_budget() {
    let g = start();
    let key = "sk-test-cut-0103";
    let (id, text) = stream_text(
        &g,
        key,
        "/v1/chat/completions",
        &common::chat_body("metered", true),
    )
    .await;
    // The last events: the error that says why, then the API's end.
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let n = events.len();
    assert_eq!(events[n - 1], "data: [DONE]");
    let error: Value =
        serde_json::from_str(events[n - 2].trim_start_matches("data: ")).expect("error event");
    assert_eq!(error["error"]["code"], "budget_exhausted", "{error}");
    let content = events
        .iter()
        .filter(|e| e.contains(r#""content":""#) && !e.contains(r#""content":"""#))
        .count();
    let record =
        common::await_key_record(&client(), &g.direct, key, &id, Duration::from_secs(5)).await;
    assert_eq!(record["status"], 200);
    assert_eq!(record["estimated"], true);
    assert_eq!(
        record["completion_tokens"].as_u64(),
        Some(content as u64),
        "{record}"
    );
    let cost = record["cost"].as_f64().expect("cost");
    assert!(cost <= 1.0 + 1e-9 && cost > 0.8, "{record}");
    assert!(common::spend_of(&g, key).await <= 1.0 + 1e-9);

    // Anthropic's framing: an `error` event ends the stream. What is left of the budget is
    // small now: the next stream is cut sooner, and a spent key is refused.
    let body = json!({"model": "metered", "max_tokens": 100000, "stream": true,
                      "messages": [{"role": "user", "content": "say hello"}]});
    let r = send(
        &g.main,
        "/v1/messages",
        Some(key),
        &body,
        &[("x-mock-chunks", "5000"), ("x-mock-ignore-max-tokens", "1")],
    )
    .await;
    match r.status().as_u16() {
        200 => {
            let text = r.text().await.expect("stream");
            let last = text.trim_end().rsplit("\n\n").next().expect("event");
            assert!(last.starts_with("event: error\ndata: "), "{last}");
            assert!(last.contains(r#""type":"budget_exhausted""#), "{last}");
            assert!(!text.contains("message_stop"));
        }
        402 => {}
        s => panic!("status {s}"),
    }
    common::eventually_async(
        Duration::from_secs(5),
        "the spend never reached 0.9",
        async || {
            let s = common::spend_of(&g, key).await;
            if s < 0.9 {
                Err(format!("spent {s}"))
            } else {
                Ok(())
            }
        },
    )
    .await;
    assert!(common::spend_of(&g, key).await <= 1.0 + 1e-9);
}

/// 200 plain clients and 20 long streams from an upstream that ignores the output limit, all
/// at once on one key: together they use the budget and spend at most it plus one output
/// event's cost a stream (0.001 here).
#[tokio::test(flavor = "multi_thread")]
async fn plain_clients_and_long_streams_together_spend_at_most_the_budget() {
    let g = start();
    let key = "sk-test-mixed-0107";
    const LONG: &[(&str, &str)] = &[("x-mock-chunks", "5000"), ("x-mock-ignore-max-tokens", "1")];
    // The streams first: the plain clients come once one of them is running.
    let streaming = Arc::new(AtomicBool::new(false));
    let streams: Vec<_> = (0..20)
        .map(|i| {
            let base = [&g.main, &g.direct][i % 2].clone();
            let mut body = common::chat_body("metered", true);
            body["max_tokens"] = json!(30);
            tokio::spawn(until_spent_with(
                base,
                key,
                body,
                LONG,
                Some(streaming.clone()),
            ))
        })
        .collect();
    common::eventually_async(Duration::from_secs(5), "no stream served", async || {
        streaming
            .load(Ordering::SeqCst)
            .then_some(())
            .ok_or("none yet".to_string())
    })
    .await;
    let plain = (0..200).map(|i| {
        let base = [&g.main, &g.direct][i % 2].clone();
        tokio::spawn(until_spent(base, key, common::chat_body("metered", false)))
    });
    let tasks: Vec<_> = streams.into_iter().chain(plain).collect();
    let mut sent = 0;
    for t in tasks {
        sent += t.await.expect("task").1;
    }
    let all = records(&g, key, sent as usize).await;
    let billed: f64 = all.iter().map(|r| r["cost"].as_f64().unwrap_or(0.0)).sum();
    let spent = common::spend_of(&g, key).await;
    assert!(
        (billed - spent).abs() < 1e-9,
        "records {billed}, spend {spent}"
    );
    assert!(
        all.iter().any(|r| r["cut"] == "budget"),
        "no stream was cut at what it held"
    );
    assert!(spent <= 1.0 + 20.0 * 0.001 + 1e-9, "spent {spent} of 1.0");
    assert!(spent >= 0.95, "the budget was used: {spent}");
}

/// A compressed stream is cut the same way: it goes on decoded, so that the cut's events
/// reach the client as the end of the stream it reads.
#[tokio::test(flavor = "multi_thread")]
async fn a_compressed_stream_is_cut_at_the_budget_in_its_framing() {
    let g = start();
    let key = "sk-test-cut-gzip-0106";
    let r = send(
        &g.main,
        "/v1/chat/completions",
        Some(key),
        &common::chat_body("metered", true),
        &[
            ("x-mock-chunks", "5000"),
            ("x-mock-ignore-max-tokens", "1"),
            ("x-mock-gzip", "1"),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("content-encoding").is_none());
    let id = common::request_id(&r);
    let text = r.text().await.expect("stream");
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let n = events.len();
    assert_eq!(events[n - 1], "data: [DONE]");
    assert!(
        events[n - 2].contains("budget_exhausted"),
        "{}",
        events[n - 2]
    );
    let record =
        common::await_key_record(&client(), &g.direct, key, &id, Duration::from_secs(5)).await;
    assert_eq!(record["cut"], "budget", "{record}");
    assert!(common::spend_of(&g, key).await <= 1.0 + 1e-9);
}

/// A request that names no output limit holds the model's `max_output_tokens`, and the
/// upstream is told that limit: with budget to spare, a long reply ends there as a
/// length-limited one (never cut as if the budget had run out, never past what was held).
#[tokio::test(flavor = "multi_thread")]
async fn a_request_naming_no_limit_is_sent_the_output_held() {
    let g = start();
    let key = "sk-test-roomy-0105";
    let long = [("x-mock-chunks", "1000")];
    let r = send(
        &g.main,
        "/v1/chat/completions",
        Some(key),
        &common::chat_body("wordy", true),
        &long,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-modelgate-budget-limited").is_none());
    let stream_id = common::request_id(&r);
    let text = r.text().await.expect("stream");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("budget_exhausted"), "{text}");
    assert!(text.contains(r#""finish_reason":"length""#));
    let r = send(
        &g.main,
        "/v1/chat/completions",
        Some(key),
        &common::chat_body("wordy", false),
        &long,
    )
    .await;
    assert_eq!(r.status(), 200);
    let plain_id = common::request_id(&r);
    let reply: Value = r.json().await.expect("json");
    assert_eq!(reply["choices"][0]["finish_reason"], "length", "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 300, "{reply}");
    for id in [stream_id, plain_id] {
        let record =
            common::await_key_record(&client(), &g.direct, key, &id, Duration::from_secs(5)).await;
        assert_eq!(record["completion_tokens"], 300, "{record}");
        assert_eq!(record["cut"], "", "{record}");
        assert_eq!(record["estimated"], false, "{record}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tpm_holds_under_two_hundred_concurrent_clients() {
    let g = start();
    let key = "sk-test-window-0104";
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let base = [&g.main, &g.direct][i % 2].clone();
            tokio::spawn(async move {
                let mut body = common::chat_body("echo-1", false);
                body["max_tokens"] = json!(8);
                send(&base, "/v1/chat/completions", Some(key), &body, &[])
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut sent = 0;
    for t in tasks {
        let s = t.await.expect("task");
        assert!(s == 200 || s == 429, "status {s}");
        sent += 1;
    }
    // Then, once every hold is settled (each request's record made), one at a time until
    // the window is full.
    records(&g, key, sent).await;
    loop {
        let mut body = common::chat_body("echo-1", false);
        body["max_tokens"] = json!(8);
        let r = send(&g.main, "/v1/chat/completions", Some(key), &body, &[]).await;
        sent += 1;
        if r.status() == 429 {
            break;
        }
        assert_eq!(r.status(), 200);
        r.bytes().await.expect("body");
        // Each reply's tokens count when its record is made.
        records(&g, key, sent).await;
    }
    let all = records(&g, key, sent).await;
    let tokens: u64 = all
        .iter()
        .map(|r| r["total_tokens"].as_u64().unwrap_or(0))
        .sum();
    // Every request came within the minute: at most the window's 1,000 tokens, and most of it.
    assert!(tokens <= 1000, "{tokens} tokens in the window");
    assert!(tokens >= 950, "{tokens} tokens in the window");
}
