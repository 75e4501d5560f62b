//! Metering and the usage store: one record per request that passed auth, exact tokens from
//! plain and streamed replies, estimates when the upstream reports none, cancelled and cut
//! streams, the usage API (JSON and CSV), budgets, restarts and a burst before SIGTERM.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};

async fn usage_page(base: &str, key: &str, query: &str) -> Value {
    let resp = get(base, &format!("/api/usage?{query}"), Some(key)).await;
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    resp.json().await.expect("json")
}

/// Waits (bounded) until the record with this request id is readable, and returns it.
async fn record_of(base: &str, key: &str, request_id: &str) -> Value {
    eventually_async(
        Duration::from_secs(10),
        &format!("no record for {request_id}"),
        async || {
            let page = usage_page(base, key, "limit=10000").await;
            page["data"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["request_id"] == request_id)
                .cloned()
                .ok_or_else(String::new)
        },
    )
    .await
}

/// Sends, drains the reply, and returns (request id, body).
async fn call(
    base: &str,
    key: &str,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (String, Vec<u8>) {
    let resp = send(base, path, Some(key), body, headers).await;
    let id = request_id(&resp);
    (id, resp.bytes().await.expect("body").to_vec())
}

fn tokens(r: &Value) -> (u64, u64, u64) {
    let n = |f: &str| r[f].as_u64().unwrap_or(u64::MAX);
    (
        n("prompt_tokens"),
        n("completion_tokens"),
        n("total_tokens"),
    )
}

/// A chat (streamed or not) with the test key and one of the mock's switches.
async fn chat_with(base: &str, stream: bool, mock: (&str, &str)) -> reqwest::Response {
    send(
        base,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", stream),
        &[mock],
    )
    .await
}

#[tokio::test]
async fn every_endpoint_leaves_one_record_with_the_upstreams_exact_tokens_on_both_listeners() {
    let g = start();
    for base in g.bases() {
        let listener = if base == g.main { "main" } else { "direct" };
        let (id, _) = call(
            &base,
            KEY,
            "/v1/chat/completions",
            &chat_body("echo-1", false),
            &[],
        )
        .await;
        let r = record_of(&base, KEY, &id).await;
        assert_eq!(tokens(&r), (4, 8, 12));
        assert_eq!(
            (
                r["endpoint"].as_str(),
                r["listener"].as_str(),
                r["status"].as_u64()
            ),
            (Some("chat"), Some(listener), Some(200))
        );
        assert_eq!(
            (
                r["stream"].as_bool(),
                r["estimated"].as_bool(),
                r["key_id"].as_str()
            ),
            (Some(false), Some(false), Some("full"))
        );
        assert!(
            r["upstream"]
                .as_str()
                .is_some_and(|u| u.starts_with("http://127.0.0.1:"))
        );
        assert!(r["ttft_ms"].is_u64() && r["latency_ms"].is_u64());

        let (id, _) = call(
            &base,
            KEY,
            "/v1/completions",
            &json!({"model": "echo-1", "prompt": "one two three"}),
            &[],
        )
        .await;
        assert_eq!(tokens(&record_of(&base, KEY, &id).await), (3, 8, 11));
        let (id, _) = call(
            &base,
            KEY,
            "/v1/embeddings",
            &json!({"model": "echo-1", "input": ["a b", "c"]}),
            &[],
        )
        .await;
        let r = record_of(&base, KEY, &id).await;
        assert_eq!(
            (tokens(&r), r["endpoint"].as_str()),
            ((3, 0, 3), Some("embeddings"))
        );
        let (id, _) = call(
            &base,
            KEY,
            "/v1/moderations",
            &json!({"model": "echo-1", "input": "x y"}),
            &[],
        )
        .await;
        assert_eq!(record_of(&base, KEY, &id).await["endpoint"], "moderations");
        let (id, _) = call(
            &base,
            KEY,
            "/v1/images/generations",
            &json!({"model": "priced-model", "prompt": "cat"}),
            &[],
        )
        .await;
        let r = record_of(&base, KEY, &id).await;
        assert_eq!(
            (tokens(&r), r["endpoint"].as_str(), r["cost"].as_f64()),
            ((0, 0, 0), Some("images"), Some(0.5))
        );
        let (id, _) = call(
            &base,
            KEY,
            "/v1/audio/speech",
            &json!({"model": "echo-1", "input": "hi", "voice": "a"}),
            &[],
        )
        .await;
        assert_eq!(record_of(&base, KEY, &id).await["endpoint"], "audio");
        // Refusals after auth are recorded too.
        let (id, _) = call(
            &base,
            KEY,
            "/v1/chat/completions",
            &chat_body("no-such-model", false),
            &[],
        )
        .await;
        let r = record_of(&base, KEY, &id).await;
        assert_eq!(
            (r["status"].as_u64(), r["model"].as_str(), tokens(&r)),
            (Some(404), Some("no-such-model"), (0, 0, 0))
        );
    }
}

#[tokio::test]
async fn streams_are_metered_exactly_with_and_without_include_usage_split_anywhere() {
    let g = start();
    for split in ["1", "3", "7", "64"] {
        // Without include_usage: the gateway asks for it and hides it from the client.
        let (id, body) = call(
            &g.main,
            KEY,
            "/v1/chat/completions",
            &chat_body("echo-1", true),
            &[("x-mock-split", split)],
        )
        .await;
        let text = String::from_utf8(body).expect("utf-8");
        assert!(
            !text.contains("usage"),
            "the client saw usage it did not ask for (split {split}): {text}"
        );
        assert!(text.trim_end().ends_with("data: [DONE]"));
        let r = record_of(&g.main, KEY, &id).await;
        assert_eq!(
            (tokens(&r), r["estimated"].as_bool(), r["stream"].as_bool()),
            ((4, 8, 12), Some(false), Some(true)),
            "split {split}"
        );

        // With include_usage: passed through untouched, and metered.
        let mut asked = chat_body("echo-1", true);
        asked["stream_options"] = json!({"include_usage": true});
        let (id, body) = call(
            &g.direct,
            KEY,
            "/v1/chat/completions",
            &asked,
            &[("x-mock-split", split)],
        )
        .await;
        assert!(String::from_utf8_lossy(&body).contains("\"completion_tokens\":8"));
        assert_eq!(tokens(&record_of(&g.direct, KEY, &id).await), (4, 8, 12));
    }
}

#[tokio::test]
async fn an_upstream_that_ignores_include_usage_is_estimated_with_the_tokenizer() {
    let g = start();
    let (id, body) = call(
        &g.main,
        KEY,
        "/v1/chat/completions",
        &chat_body("echo-1", true),
        &[("x-mock-ignore-include-usage", "1"), ("x-mock-split", "5")],
    )
    .await;
    assert!(String::from_utf8_lossy(&body).contains("[DONE]"));
    let r = record_of(&g.main, KEY, &id).await;
    let tokenizers = modelgate::meter::estimate::Tokenizers::default();
    let prompt = tokenizers.count("echo-1", "say hello to me");
    let completion = tokenizers.count("echo-1", MOCK_TEXT);
    assert_eq!(tokens(&r), (prompt, completion, prompt + completion));
    assert_eq!(r["estimated"], true);
}

/// With `on_client_gone = "cancel"` (by default the stream is read on for its usage:
/// `tests/client_gone.rs`).
#[tokio::test]
async fn a_client_that_goes_away_mid_stream_is_recorded_as_499_with_the_tokens_so_far() {
    let g = start_with(Setup {
        server_extra: "on_client_gone = \"cancel\"".into(),
        ..Setup::default()
    });
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", true),
        &[("x-mock-chunks", "40"), ("x-mock-delay-ms", "50")],
    )
    .await;
    let id = request_id(&resp);
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("Hello") {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.expect("piece").expect("ok"),
        ));
    }
    drop(stream);
    let r = record_of(&g.main, KEY, &id).await;
    assert_eq!(r["status"], 499);
    let (_, completion, _) = tokens(&r);
    assert!((1..40).contains(&completion), "tokens so far: {r}");
    assert_eq!(r["estimated"], true);
    // A client going away is routine: its record says so, the error log does not.
    let log = g.stop_and_stderr();
    assert!(!log.contains("ERROR"), "{log}");
}

/// The same with a client that resets its connection (closed with unread data or SO_LINGER
/// 0, as a killed process or a load balancer does): 499, and still no error line.
#[tokio::test]
async fn a_client_that_resets_mid_stream_is_recorded_as_499_without_an_error_line() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    let body = serde_json::to_vec(&chat_body("echo-1", true)).expect("json");
    let mut s = raw_connect(&g.main).await;
    let head = chat_head(
        KEY,
        body.len(),
        "x-mock-chunks: 200000\r\nx-mock-delay-ms: 0\r\n",
    );
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(&body).await.expect("body");
    let mut seen = String::new();
    while !seen.contains("Hello") {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.expect("read");
        assert!(n > 0, "closed early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
    }
    let id = request_id_in(&seen);
    s.set_zero_linger().expect("linger");
    drop(s);
    let r = record_of(&g.main, KEY, &id).await;
    assert_eq!(r["status"], 499, "{r}");
    let log = g.stop_and_stderr();
    assert!(!log.contains("ERROR"), "{log}");
}

#[tokio::test]
async fn an_upstream_that_cuts_the_stream_is_recorded_as_502_with_the_tokens_so_far() {
    let g = start();
    let resp = chat_with(&g.direct, true, ("x-mock-cut-after", "4")).await;
    let id = request_id(&resp);
    // The client's reply is cut too: it must not look complete.
    if let Ok(body) = resp.bytes().await {
        assert!(!String::from_utf8_lossy(&body).contains("[DONE]"));
    }
    let r = record_of(&g.direct, KEY, &id).await;
    assert_eq!(r["status"], 502);
    let (_, completion, _) = tokens(&r);
    assert!(completion >= 1, "{r}");
}

#[tokio::test]
async fn keys_see_only_their_own_records() {
    let g = start();
    let (mine, _) = call(
        &g.main,
        KEY,
        "/v1/chat/completions",
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    let (theirs, _) = call(
        &g.main,
        OTHER_KEY,
        "/v1/chat/completions",
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    record_of(&g.main, KEY, &mine).await;
    record_of(&g.main, OTHER_KEY, &theirs).await;
    for (key, own, other) in [(KEY, &mine, &theirs), (OTHER_KEY, &theirs, &mine)] {
        let page = usage_page(&g.direct, key, "limit=10000").await;
        let ids: Vec<&str> = page["data"]
            .as_array()
            .expect("data")
            .iter()
            .filter_map(|r| r["request_id"].as_str())
            .collect();
        assert!(
            ids.contains(&own.as_str()) && !ids.contains(&other.as_str()),
            "{ids:?}"
        );
    }
}

/// Returns once the wall clock is in a later millisecond than when called.
async fn next_millisecond() {
    let ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    };
    let start = ms();
    while ms() == start {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn time_filters_and_cursor_pages_select_exactly_the_range() {
    let g = start();
    let mut ids = Vec::new();
    for _ in 0..5 {
        // Records carry milliseconds, and five calls can fit in one: each starts in a
        // millisecond of its own, so that the range `[.., t)` splits them where expected.
        next_millisecond().await;
        ids.push(
            call(
                &g.main,
                OTHER_KEY,
                "/v1/embeddings",
                &json!({"model": "echo-1", "input": "x"}),
                &[],
            )
            .await
            .0,
        );
    }
    let last = record_of(&g.main, OTHER_KEY, &ids[4]).await;
    let t = last["time"].as_str().expect("time").to_string();
    // `end` is exclusive: the last record is outside [.., t).
    let before = usage_page(
        &g.main,
        OTHER_KEY,
        &format!("end={}", t.replace(':', "%3A")),
    )
    .await;
    assert!(
        before["data"]
            .as_array()
            .expect("data")
            .iter()
            .all(|r| r["request_id"] != ids[4].as_str())
    );
    let from = usage_page(
        &g.main,
        OTHER_KEY,
        &format!("start={}", t.replace(':', "%3A")),
    )
    .await;
    assert!(
        from["data"]
            .as_array()
            .expect("data")
            .iter()
            .any(|r| r["request_id"] == ids[4].as_str())
    );
    let future = usage_page(&g.main, OTHER_KEY, "start=4102444800&end=4102448400").await;
    assert_eq!(future["data"].as_array().map(Vec::len), Some(0));
    // Pages of 2 return every record once, in time order (usage calls leave records too:
    // only the embeddings are compared).
    let mut seen = Vec::new();
    let mut query = "limit=2".to_string();
    let end = format!("end={}", t.replace(':', "%3A"));
    loop {
        let page = usage_page(&g.direct, OTHER_KEY, &format!("{query}&start=0&{end}")).await;
        let data = page["data"].as_array().expect("data");
        assert!(data.len() <= 2);
        seen.extend(
            data.iter()
                .filter(|r| r["endpoint"] == "embeddings")
                .map(|r| r["request_id"].as_str().unwrap_or("").to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => query = format!("limit=2&cursor={c}"),
            None => break,
        }
    }
    seen.push(ids[4].clone());
    assert_eq!(seen, ids);
}

#[tokio::test]
async fn csv_export_has_the_contract_header_and_the_same_rows_as_json() {
    let g = start();
    for _ in 0..3 {
        let (id, _) = call(
            &g.main,
            OTHER_KEY,
            "/v1/chat/completions",
            &chat_body("echo-1", true),
            &[],
        )
        .await;
        record_of(&g.main, OTHER_KEY, &id).await;
    }
    let resp = get(&g.direct, "/api/usage.csv", Some(OTHER_KEY)).await;
    assert_eq!(resp.status(), 200);
    // Chunked: a cut export shows as cut (not a body ended by a close).
    assert_eq!(resp.headers()["transfer-encoding"], "chunked");
    assert!(
        resp.headers()["content-disposition"]
            .to_str()
            .expect("ascii")
            .starts_with("attachment")
    );
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/csv")
    );
    let csv = resp.text().await.expect("body");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "time,request_id,key_id,listener,endpoint,model,status,stream,prompt_tokens,completion_tokens,total_tokens,cost,latency_ms,ttft_ms,upstream,estimated,attempts,served_model,cut,cached_prompt_tokens,cache_write_tokens,reasoning_tokens"
        )
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let page = usage_page(&g.direct, OTHER_KEY, "limit=10000").await;
    let json_rows = page["data"].as_array().expect("data");
    assert_eq!(rows.len(), json_rows.len());
    for (row, r) in rows.iter().zip(json_rows) {
        assert_eq!(row[0], r["time"].as_str().unwrap_or(""));
        assert_eq!(row[1], r["request_id"].as_str().unwrap_or(""));
        assert_eq!(row[8].parse::<u64>().ok(), r["prompt_tokens"].as_u64());
        assert_eq!(row[9].parse::<u64>().ok(), r["completion_tokens"].as_u64());
        assert_eq!(row[6].parse::<u64>().ok(), r["status"].as_u64());
    }
}

#[tokio::test]
async fn a_key_in_the_url_and_bad_ranges_are_refused() {
    let g = start();
    for q in [
        "api_key=sk-test-full-access-0001",
        "start=yesterday",
        "limit=10001",
    ] {
        let resp = get(&g.main, &format!("/api/usage?{q}"), Some(KEY)).await;
        let (status, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (400, Some("invalid_parameter")),
            "{q}"
        );
    }
    let resp = get(&g.main, "/api/usage", None).await;
    assert_eq!(error_of(resp).await.0, 401);
    let resp = get(&g.main, "/api/usage", Some(MODELS_ONLY_KEY)).await;
    let (status, e) = error_of(resp).await;
    assert_eq!((status, e["param"].as_str()), (403, Some("endpoint")));
}

#[tokio::test]
async fn a_spent_budget_gives_402_and_spend_and_records_survive_a_restart() {
    // Today's rule: one request may pass the budget (12.5 of 10), the next gets 402.
    let g = start_with(Setup {
        limits_extra: "budget_mode = \"after\"\n".into(),
        ..Setup::default()
    });
    // priced-model: 1 credit per token + 0.5 per request; the key's budget is 10.
    let (id, _) = call(
        &g.main,
        BUDGET_KEY,
        "/v1/chat/completions",
        &chat_body("priced-model", false),
        &[],
    )
    .await;
    let r = record_of(&g.main, BUDGET_KEY, &id).await;
    assert_eq!(r["cost"].as_f64(), Some(12.5));
    let resp = send(
        &g.direct,
        "/v1/chat/completions",
        Some(BUDGET_KEY),
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    let refused = request_id(&resp);
    let (status, e) = error_of(resp).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (402, Some("insufficient_balance"))
    );
    record_of(&g.main, BUDGET_KEY, &refused).await;
    // The budget is checked before the body is read: a spent key is refused even with a body
    // that would not parse, and its upload is never taken.
    let resp = client()
        .post(format!("{}/v1/chat/completions", g.main))
        .bearer_auth(BUDGET_KEY)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("send");
    assert_eq!(error_of(resp).await.0, 402);
    // Counting tokens spends nothing, so it needs no balance either.
    let resp = send(
        &g.main,
        "/v1/messages/count_tokens",
        Some(BUDGET_KEY),
        &serde_json::json!({"model": "echo-1", "messages": [{"role": "user", "content": "hi"}]}),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    // The usage API still answers a key with no balance left (its own calls are recorded too).
    let page = usage_page(&g.main, BUDGET_KEY, "limit=10000").await;
    let chat: Vec<u64> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter(|r| r["endpoint"] == "chat")
        .filter_map(|r| r["status"].as_u64())
        .collect();
    assert_eq!(chat, [200, 402]);

    let g = g.restart();
    let page = usage_page(&g.main, BUDGET_KEY, "").await;
    assert!(
        page["data"]
            .as_array()
            .expect("data")
            .iter()
            .any(|r| r["request_id"] == id.as_str())
    );
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(BUDGET_KEY),
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    assert_eq!(error_of(resp).await.0, 402, "spend survived the restart");
}

/// A gateway with a model `tenth` at 0.1 credit a request and a key `secret` with `budget`.
fn with_budget(id: &str, secret: &str, budget: f64) -> Gateway {
    start_with(Setup {
        extra_config: "[[models]]\nname = \"tenth\"\npool = \"local\"\nupstream_model = \"echo-1\"\nprice = { prompt = 0.0, completion = 0.0, request = 0.1 }\n".into(),
        extra_keys: format!("[[keys]]\nid = \"{id}\"\nsecret = \"{secret}\"\nbudget = {budget}\n"),
        ..Setup::default()
    })
}

/// The status of one chat with the model `tenth`.
async fn tenth(base: &str, key: &str) -> u16 {
    let resp = send(
        base,
        "/v1/chat/completions",
        Some(key),
        &chat_body("tenth", false),
        &[],
    )
    .await;
    let status = resp.status().as_u16();
    let _ = resp.bytes().await;
    status
}

#[tokio::test]
async fn costs_that_add_up_to_the_budget_spend_it_exactly() {
    // Eight requests at 0.1 reach a budget of 0.8: added in floating point they make
    // 0.7999999999999999, and a ninth was served while the pages showed nothing left.
    let key = "sk-test-eight-tenths-0099";
    let g = with_budget("eight-tenths", key, 0.8);
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(tenth(&g.main, key).await);
    }
    // A request's cost is added once its reply has gone: awaited before the ninth.
    let deadline = Instant::now() + Duration::from_secs(5);
    let summary = loop {
        let summary: Value = get(&g.main, "/api/usage/summary", Some(key))
            .await
            .json()
            .await
            .expect("summary");
        if summary["key"]["spend"].as_f64() >= Some(0.8) || Instant::now() > deadline {
            break summary;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    statuses.push(tenth(&g.main, key).await);
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200, 200, 402]);
    assert_eq!(summary["key"]["spend"].as_f64(), Some(0.8), "{summary}");
    assert_eq!(summary["key"]["remaining"].as_f64(), Some(0.0), "{summary}");
    let billing: Value = get(&g.main, "/v1/dashboard/billing/subscription", Some(key))
        .await
        .json()
        .await
        .expect("billing");
    assert_eq!(
        billing["modelgate"]["spend"].as_f64(),
        Some(0.8),
        "{billing}"
    );
    // The store's total is a floating-point sum too: still spent after a restart.
    let g = g.restart();
    assert_eq!(tenth(&g.main, key).await, 402);
}

#[tokio::test]
async fn no_record_is_lost_after_a_burst_followed_at_once_by_sigterm() {
    burst_then("-TERM").await;
}

#[tokio::test]
async fn no_record_is_lost_after_a_burst_followed_at_once_by_sigint() {
    burst_then("-INT").await;
}

async fn burst_then(signal: &str) {
    let mut g = start();
    let n = 400;
    let base = g.direct.clone();
    let c = client();
    let sends = (0..n).map(|_| {
        let c = c.clone();
        let base = base.clone();
        async move {
            let resp = c
                .post(format!("{base}/v1/embeddings"))
                .bearer_auth(OTHER_KEY)
                .json(&json!({"model": "echo-1", "input": "x"}))
                .send()
                .await;
            resp.map(|r| r.status().as_u16()).unwrap_or(0)
        }
    });
    let statuses = futures_util::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let status = g.signal(signal);
    assert!(status.success(), "{signal}: {status}");
    let g = g.restart_stopped();
    let csv = get(&g.main, "/api/usage.csv", Some(OTHER_KEY))
        .await
        .text()
        .await
        .expect("body");
    assert_eq!(
        csv.lines().count() - 1,
        n,
        "records after the burst and SIGTERM"
    );
}

/// `/readyz` checks the store: while another process holds the database locked the writer's
/// batch fails and the gateway says it is not ready, naming the store; once the lock goes, the
/// next batch is written and it is ready again.
#[tokio::test]
async fn readyz_is_503_while_the_store_cannot_write_and_200_again_after() {
    let g = start();
    let readyz = || async {
        let resp = reqwest::get(format!("{}/readyz", g.admin))
            .await
            .expect("readyz");
        (resp.status().as_u16(), resp.text().await.expect("body"))
    };
    assert_eq!(readyz().await.0, 200);
    // The records' table taken away: every batch fails (not a lock, which only delays it).
    let other = rusqlite::Connection::open(g.dir.path().join("usage.db")).expect("open");
    other
        .execute_batch("ALTER TABLE usage RENAME TO usage_away")
        .expect("rename");
    let resp = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    assert_eq!(resp.status(), 200);
    let body = eventually_async(Duration::from_secs(30), "still ready", async || {
        let (status, body) = readyz().await;
        if status == 503 { Ok(body) } else { Err(body) }
    })
    .await;
    assert!(body.contains("usage store"), "{body}");
    other
        .execute_batch("ALTER TABLE usage_away RENAME TO usage")
        .expect("rename back");
    drop(other);
    let resp = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    let id = request_id(&resp);
    await_record(&g, &id).await;
    let (status, body) = readyz().await;
    assert_eq!(status, 200, "{body}");
}

/// Another process holding the database file past the writer's busy timeout (5 s) only delays
/// the records: they wait in the spool, the gateway stays ready, and the record is there once
/// the lock goes.
#[tokio::test]
async fn a_database_file_locked_by_another_process_delays_records_and_loses_none() {
    let g = start();
    let lock = rusqlite::Connection::open(g.dir.path().join("usage.db")).expect("open");
    lock.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    let resp = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    eventually_async(Duration::from_secs(30), "never spooled", async || {
        if metric_value(&g, "modelgate_usage_spool_bytes").await == 0.0 {
            Err(String::new())
        } else {
            Ok(())
        }
    })
    .await;
    let ready = reqwest::get(format!("{}/readyz", g.admin))
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
    lock.execute_batch("COMMIT").expect("unlock");
    drop(lock);
    let r = await_record(&g, &id).await;
    assert_eq!(r["status"], 200, "{r}");
}

/// Records that wait in the spool across a restart (the database still locked by another
/// process) count in the key's spend at once: their costs are not in the database's totals
/// yet, and the key was served past its budget until they were.
#[tokio::test]
async fn costs_waiting_in_the_spool_count_against_the_budget_after_a_restart() {
    let key = "sk-test-quarter-budget-0098";
    let mut g = with_budget("quarter", key, 0.25);
    let lock = rusqlite::Connection::open(g.dir.path().join("usage.db")).expect("open");
    lock.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    assert_eq!(
        (tenth(&g.main, key).await, tenth(&g.main, key).await),
        (200, 200)
    );
    assert!(g.terminate().success());
    assert!(
        std::fs::metadata(g.dir.path().join("usage-spool.jsonl")).is_ok_and(|m| m.len() > 0),
        "the records wait in the spool"
    );
    let g = g.restart_stopped();
    // 0.2 spent (in the spool): 0.05 left cannot pay a request of 0.1.
    assert_eq!(tenth(&g.main, key).await, 402);
    let summary: Value = get(&g.main, "/api/usage/summary", Some(key))
        .await
        .json()
        .await
        .expect("summary");
    assert_eq!(summary["key"]["spend"].as_f64(), Some(0.2), "{summary}");
    lock.execute_batch("COMMIT").expect("unlock");
}

/// Usage the upstream sends that cannot be true (past any context, not an object, counting
/// nothing) is not believed: the request is estimated as one without usage, so one absurd reply
/// cannot spend a key's budget or overflow the store's sums.
#[tokio::test]
async fn usage_that_cannot_be_true_is_estimated_instead() {
    let g = start();
    let tokenizers = modelgate::meter::estimate::Tokenizers::default();
    let prompt = tokenizers.count("echo-1", "say hello to me");
    for usage in [
        r#"{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775807,"total_tokens":9223372036854775807}"#,
        r#"{"prompt_tokens":1000000000000,"completion_tokens":1}"#,
        "[1,2,3]",
        "{}",
        r#"{"prompt_tokens":null,"completion_tokens":null}"#,
    ] {
        for stream in [false, true] {
            let (id, body) = call(
                &g.main,
                KEY,
                "/v1/chat/completions",
                &chat_body("echo-1", stream),
                &[("x-mock-usage", usage)],
            )
            .await;
            let r = record_of(&g.main, KEY, &id).await;
            assert_eq!(r["status"], 200, "{usage}: {r}");
            assert_eq!(r["estimated"], true, "{usage} stream={stream}: {r}");
            let (p, c, t) = tokens(&r);
            assert_eq!(p, prompt, "{usage} stream={stream}: {r}");
            assert_eq!(t, p + c, "{r}");
            assert!(c < 100, "{r}");
            if stream {
                // The usage event the gateway asked for is still kept from a client that did not.
                let text = String::from_utf8_lossy(&body);
                assert!(!text.contains("\"usage\""), "{usage}: {text}");
                assert!(text.contains("[DONE]"), "{text}");
            }
        }
    }
    // The usage API's sums and the billing view still read.
    let summary = get(&g.main, "/api/usage/summary", Some(KEY)).await;
    assert_eq!(summary.status(), 200);
    let billing = get(&g.main, "/v1/dashboard/billing/usage", Some(KEY)).await;
    assert_eq!(billing.status(), 200);
}

/// Once the upstream's success header came back it has read the prompt: a reply cut before
/// any content still counts the prompt, estimated; one the client abandoned is read on for the
/// upstream's own usage (`on_client_gone = "finish"`, the default).
#[tokio::test]
async fn a_reply_cut_or_abandoned_before_content_counts_its_prompt() {
    let g = start();
    let tokenizers = modelgate::meter::estimate::Tokenizers::default();
    let prompt = tokenizers.count("echo-1", "say hello to me");
    // The upstream cuts the stream before its first event (the client's body is cut too).
    let resp = chat_with(&g.direct, true, ("x-mock-cut-after", "0")).await;
    let id = request_id(&resp);
    assert!(resp.bytes().await.is_err(), "the cut must show");
    let r = record_of(&g.direct, KEY, &id).await;
    assert_eq!(r["status"], 502, "{r}");
    assert_eq!(tokens(&r), (prompt, 0, prompt), "{r}");
    assert_eq!(r["estimated"], true, "{r}");
    // The client leaves once it has the header, before the first event (0.3 s away).
    let resp = chat_with(&g.main, true, ("x-mock-delay-ms", "300")).await;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    drop(resp);
    let r = record_of(&g.main, KEY, &id).await;
    assert_eq!(r["status"], 499, "{r}");
    assert_eq!(r["estimated"], false, "{r}");
    let (p, completion, _) = tokens(&r);
    assert!(p > 0 && completion > 0, "{r}");
}

/// An informational reply (`103 Early Hints`…) before the real one is skipped; an upstream
/// switching protocols on a model call is broken: 502, and either way one record.
#[tokio::test]
async fn informational_upstream_replies_are_skipped_and_101_is_an_upstream_error() {
    let g = start();
    for status in ["100", "102", "103"] {
        for stream in [false, true] {
            let resp = chat_with(&g.main, stream, ("x-mock-informational", status)).await;
            assert_eq!(resp.status(), 200, "{status}");
            let id = request_id(&resp);
            let body = resp.text().await.expect("body");
            assert!(body.contains("Hello"), "{status}: {body}");
            let r = record_of(&g.main, KEY, &id).await;
            assert_eq!(r["status"], 200, "{r}");
            assert_eq!(r["estimated"], false, "{r}");
        }
    }
    let resp = chat_with(&g.main, false, ("x-mock-informational", "101")).await;
    let id = request_id(&resp);
    let (status, e) = error_of(resp).await;
    assert_eq!((status, e["code"].as_str()), (502, Some("upstream_error")));
    let r = record_of(&g.main, KEY, &id).await;
    assert_eq!(r["status"], 502, "{r}");
    let log = g.stop_and_stderr();
    assert!(!log.contains("panicked"), "{log}");
}

/// An upstream reply that breaks off after its header reaches the client as cut, never as a
/// whole reply: a stream's body goes chunked (the final chunk never comes), a plain one keeps
/// its length.
#[tokio::test]
async fn a_reply_the_upstream_breaks_off_shows_as_cut() {
    let g = start();
    for stream in [true, false] {
        let resp = chat_with(&g.main, stream, ("x-mock-garbage", "1")).await;
        let id = request_id(&resp);
        let framing = if stream {
            "transfer-encoding"
        } else {
            "content-length"
        };
        assert!(resp.headers().contains_key(framing), "{:?}", resp.headers());
        assert!(
            resp.bytes().await.is_err(),
            "stream={stream}: read as whole"
        );
        let r = record_of(&g.main, KEY, &id).await;
        assert_eq!(r["status"], 502, "{r}");
    }
}

/// A web page where the API's reply belongs (a proxy's login page answering 200) is garbage:
/// 502 `upstream_error`, never passed on as a success or charged.
#[tokio::test]
async fn a_web_page_for_a_reply_is_an_upstream_error() {
    let g = start();
    for stream in [false, true] {
        let resp = chat_with(&g.main, stream, ("x-mock-html", "1")).await;
        let id = request_id(&resp);
        let (status, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (502, Some("upstream_error")),
            "{e}"
        );
        let r = record_of(&g.main, KEY, &id).await;
        assert_eq!(r["status"], 502, "{r}");
        assert_eq!(r["cost"], 0.0, "{r}");
    }
}

/// Requests naming models the gateway does not serve share one rollup row, `(unknown)`: a
/// key holder inventing names makes no per-model state, and the summary lists them once. Each
/// record keeps the name it asked for.
#[tokio::test]
async fn made_up_models_share_one_rollup_row() {
    let g = start();
    let mut last = String::new();
    for n in 0..20 {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body(&format!("made-up-{n}"), false),
            &[],
        )
        .await;
        assert_eq!(resp.status(), 404);
        last = request_id(&resp);
    }
    // The records (and the rollups written with them) are in.
    let r = record_of(&g.main, KEY, &last).await;
    assert_eq!(r["model"], "made-up-19", "{r}");
    let summary: Value = get(&g.main, "/api/usage/summary", Some(KEY))
        .await
        .json()
        .await
        .expect("summary");
    // (Besides them, only the usage calls themselves, which name no model.)
    let models: Vec<&Value> = summary["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter(|m| m["model"] != "")
        .collect();
    assert_eq!(models.len(), 1, "{summary}");
    assert_eq!(models[0]["model"], "(unknown)", "{summary}");
    assert_eq!(models[0]["requests"], 20, "{summary}");
    assert_eq!(models[0]["succeeded"], 0, "{summary}");
}

/// Ids a glob sends upstream that the upstream does not know (404) share the same row: a
/// client cannot make the gateway keep state for each name it makes up.
#[tokio::test(flavor = "multi_thread")]
async fn made_up_ids_a_glob_sends_upstream_share_one_rollup_row() {
    let g = start_with(Setup {
        extra_config: "[[models]]\nname = \"guess-*\"\npool = \"local\"\n".into(),
        ..Setup::default()
    });
    let mut last = String::new();
    for n in 0..10 {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body(&format!("guess-{n}"), false),
            &[("x-mock-status", "404")],
        )
        .await;
        assert_eq!(resp.status(), 404);
        last = request_id(&resp);
    }
    let r = record_of(&g.main, KEY, &last).await;
    assert_eq!(
        (r["model"].as_str(), r["attempts"].as_u64()),
        (Some("guess-9"), Some(1)),
        "{r}"
    );
    let summary: Value = get(&g.main, "/api/usage/summary", Some(KEY))
        .await
        .json()
        .await
        .expect("summary");
    let models: Vec<&Value> = summary["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter(|m| m["model"] != "")
        .collect();
    assert_eq!(models.len(), 1, "{summary}");
    assert_eq!(models[0]["model"], "(unknown)", "{summary}");
    assert_eq!(models[0]["requests"], 10, "{summary}");
}

/// A key's usage calls are bounded apart from its rpm (at most a few at once, and so many a
/// second): a burst of summaries is refused 429 past the bound, with `Retry-After`, while
/// another key's calls go on, and the key is served again once the burst is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_usage_calls_is_refused_past_the_keys_bound() {
    let g = start();
    let client = client();
    let calls = (0..300).map(|_| {
        let req = client
            .get(format!("{}/api/usage/summary", g.main))
            .bearer_auth(KEY);
        async move {
            let resp = req.send().await.expect("send");
            let retry_after = resp
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap_or("").to_string());
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.expect("json");
            (status, retry_after, body)
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let refused: Vec<_> = answers.iter().filter(|(s, _, _)| *s == 429).collect();
    assert!(
        answers.iter().all(|(s, _, _)| *s == 200 || *s == 429),
        "{:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    assert!(!refused.is_empty(), "300 summaries at once were all served");
    for (_, retry_after, body) in &refused {
        assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
        assert_eq!(retry_after.as_deref(), Some("1"));
    }
    let other = get(&g.main, "/api/usage/summary", Some(OTHER_KEY)).await;
    assert_eq!(other.status(), 200);
    eventually_async(
        Duration::from_secs(5),
        "the key stays refused",
        async || match get(&g.main, "/api/usage/summary", Some(KEY))
            .await
            .status()
            .as_u16()
        {
            200 => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
}

/// An upstream that answers a stream request with a plain JSON reply: the reply is metered
/// from its `usage`, as a plain reply's, not billed as an empty stream.
#[tokio::test]
async fn a_plain_reply_to_a_stream_request_is_metered_from_its_usage() {
    let g = start();
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", true),
        &[("x-mock-plain-reply", "1")],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let body: Value = resp.json().await.expect("a plain JSON reply");
    let usage = &body["usage"];
    assert!(usage["completion_tokens"].as_u64() > Some(0), "{body}");
    let r = record_of(&g.main, KEY, &id).await;
    assert_eq!(
        (
            r["prompt_tokens"].as_u64(),
            r["completion_tokens"].as_u64(),
            r["estimated"].as_bool()
        ),
        (
            usage["prompt_tokens"].as_u64(),
            usage["completion_tokens"].as_u64(),
            Some(false)
        ),
        "{r}"
    );
    assert_eq!(r["stream"], true, "{r}");
}

/// Cells a spreadsheet would run as formulas are defused in the export with a leading quote:
/// `=`, `+`, `-`, `@`, their full-width forms, and whitespace or a newline before them (model
/// names a client made up, stored as sent).
#[tokio::test(flavor = "multi_thread")]
async fn an_export_defuses_cells_a_spreadsheet_would_run() {
    let g = start();
    let names = ["\u{ff1d}SUM(A1)", " =1+1", "\n=2+2", "@cmd", "\u{ff0b}3"];
    let mut last = String::new();
    for name in names {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body(name, false),
            &[],
        )
        .await;
        assert_eq!(resp.status(), 404);
        last = request_id(&resp);
    }
    record_of(&g.main, KEY, &last).await;
    let csv = get(&g.main, "/api/usage.csv", Some(KEY))
        .await
        .text()
        .await
        .expect("body");
    for cell in [
        ",'\u{ff1d}SUM(A1),",
        ",' =1+1,",
        ",\"'\n=2+2\",",
        ",'@cmd,",
        ",'\u{ff0b}3,",
    ] {
        assert!(csv.contains(cell), "{cell:?} not in {csv}");
    }
    for raw in [",\u{ff1d}SUM", ", =1+1", ",\"\n=2+2", ",@cmd", ",\u{ff0b}3"] {
        assert!(!csv.contains(raw), "{raw:?} in {csv}");
    }
}
