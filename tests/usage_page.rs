//! The usage-record page on `direct /` and the APIs behind it: the summary from rollups, the
//! usage API's order and filters, the billing endpoints, the wrong-key throttle, and usage
//! queries that do not count against a key's rpm. Real gateway, real sockets.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;

async fn json_of(resp: reqwest::Response) -> Value {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).expect("json")
}

async fn chats(base: &str, key: &str, model: &str, n: usize) {
    for _ in 0..n {
        let resp = send(
            base,
            "/v1/chat/completions",
            Some(key),
            &chat_body(model, false),
            &[],
        )
        .await;
        resp.bytes().await.expect("body");
    }
}

/// Waits until the key's records include `n` chat records (the writer batches every 100 ms).
async fn await_chat_records(base: &str, key: &str, n: usize) -> Vec<Value> {
    eventually_async(
        std::time::Duration::from_secs(10),
        &format!("fewer than {n} chat records"),
        async || {
            let page = json_of(get(base, "/api/usage?limit=10000", Some(key)).await).await;
            let chat: Vec<Value> = page["data"]
                .as_array()
                .expect("data")
                .iter()
                .filter(|r| r["endpoint"] == "chat")
                .cloned()
                .collect();
            if chat.len() >= n {
                Ok(chat)
            } else {
                Err(format!("only {} records", chat.len()))
            }
        },
    )
    .await
}

#[tokio::test]
async fn the_page_is_on_direct_only_with_a_strict_csp_and_its_labels() {
    let g = start();
    let resp = get(&g.direct, "/", None).await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert!(h["content-type"].to_str().unwrap().starts_with("text/html"));
    let csp = h["content-security-policy"].to_str().unwrap();
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert!(h.contains_key("x-request-id"));
    let html = resp.text().await.unwrap();
    for label in [
        ">Token</label>",
        ">From</label>",
        ">To</label>",
        ">Query</button>",
        ">Export CSV</button>",
    ] {
        assert!(html.contains(label), "no {label}");
    }
    // No inline script or style, nothing from another origin.
    assert!(!html.contains("<script>") && !html.contains("style=") && !html.contains("<style"));
    assert!(!html.contains("http://") && !html.contains("https://"));
    for asset in [
        "/assets/usage.js",
        "/assets/modelgate.css",
        "/assets/vendor/uPlot.iife.min.js",
        "/assets/vendor/uPlot.min.css",
        "/assets/vendor/uPlot.LICENSE",
    ] {
        assert!(
            asset.ends_with("LICENSE") || html.contains(asset),
            "page does not load {asset}"
        );
        let resp = get(&g.direct, asset, None).await;
        assert_eq!(resp.status(), 200, "{asset}");
        assert!(resp.headers().contains_key("content-security-policy"));
        assert!(!resp.bytes().await.unwrap().is_empty());
    }
    // `main` has no usage page (its `/` is the console's).
    let (status, e) = error_of(get(&g.main, "/", None).await).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("not_found")));
    // A key in the page's URL is refused like anywhere else.
    let (status, _) = error_of(get(&g.direct, "/?token=sk-test", None).await).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_summary_adds_up_to_the_records_with_the_keys_budget_and_limits() {
    let g = start();
    chats(&g.main, BUDGET_KEY, "echo-1", 3).await;
    chats(&g.direct, BUDGET_KEY, "nope-model", 1).await; // 404, still a record
    let records = await_chat_records(&g.direct, BUDGET_KEY, 4).await;
    let v = json_of(
        get(
            &g.direct,
            "/api/usage/summary?tz=Asia/Kolkata",
            Some(BUDGET_KEY),
        )
        .await,
    )
    .await;
    assert_eq!(v["object"], "usage.summary");
    assert_eq!(v["range"]["tz"], "Asia/Kolkata");
    assert!(
        v["range"]["start"].as_str().unwrap().ends_with("+05:30"),
        "{}",
        v["range"]
    );
    let t = &v["totals"];
    // Usage calls are records too (no tokens, no cost): at least the four chats are counted.
    assert!(t["requests"].as_u64().unwrap() >= 4);
    let tokens: u64 = records
        .iter()
        .map(|r| r["total_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(t["total_tokens"].as_u64().unwrap(), tokens);
    let cost: f64 = records.iter().map(|r| r["cost"].as_f64().unwrap()).sum();
    assert!((t["cost"].as_f64().unwrap() - cost).abs() < 1e-9);
    assert!(t["failed"].as_u64().unwrap() >= 1, "the 404 is a failure");
    assert!(t["latency_p50_ms"].is_u64() && t["latency_p95_ms"].is_u64());
    let models = v["models"].as_array().unwrap();
    let echo = models
        .iter()
        .find(|m| m["model"] == "echo-1")
        .expect("echo-1 row");
    assert_eq!(echo["requests"], 3);
    assert_eq!(echo["succeeded"], 3);
    let bucket_sum: u64 = v["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["total_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(bucket_sum, tokens);
    let k = &v["key"];
    assert_eq!(k["id"], "budgeted");
    assert_eq!(k["budget"], 10.0);
    assert!((k["spend"].as_f64().unwrap() - cost).abs() < 1e-9);
    assert!((k["remaining"].as_f64().unwrap() - (10.0 - cost)).abs() < 1e-9);
    assert!(k["rpm"].is_null() && k["expires_at"].is_null());
    // Bad parameters are 400s naming what is wrong, never ignored.
    for q in [
        "colour=red",
        "start=1795400000000",
        "tz=Mars/Base",
        "bucket=fortnight",
        "start=2026-01-01&end=2026-11-01&bucket=15m",
    ] {
        let (status, e) = error_of(
            get(
                &g.main,
                &format!("/api/usage/summary?{q}"),
                Some(BUDGET_KEY),
            )
            .await,
        )
        .await;
        assert_eq!(
            (status, e["code"].as_str()),
            (400, Some("invalid_parameter")),
            "{q}: {e}"
        );
    }
}

#[tokio::test]
async fn records_come_newest_first_filtered_by_model_and_status() {
    let g = start();
    chats(&g.main, OTHER_KEY, "echo-1", 2).await;
    chats(&g.main, OTHER_KEY, "big-model", 1).await;
    chats(&g.main, OTHER_KEY, "nope-model", 1).await;
    await_chat_records(&g.main, OTHER_KEY, 4).await;
    let desc = json_of(
        get(
            &g.main,
            "/api/usage?order=desc&limit=10000",
            Some(OTHER_KEY),
        )
        .await,
    )
    .await;
    let times: Vec<&str> = desc["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["time"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    // Cursor pages of one, newest first, give the same list.
    let mut cursor: Option<String> = None;
    let mut paged = Vec::new();
    loop {
        let q = match &cursor {
            Some(c) => format!("order=desc&limit=1&cursor={c}&end={}", desc_end(&desc)),
            None => format!("order=desc&limit=1&end={}", desc_end(&desc)),
        };
        let page = json_of(get(&g.main, &format!("/api/usage?{q}"), Some(OTHER_KEY)).await).await;
        paged.extend(chat_ids(&page));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(paged, chat_ids(&desc));
    assert_eq!(paged.len(), 4);
    let echo = json_of(get(&g.main, "/api/usage?model=echo-1", Some(OTHER_KEY)).await).await;
    assert_eq!(echo["data"].as_array().unwrap().len(), 2);
    let missing = json_of(get(&g.main, "/api/usage?status=4xx", Some(OTHER_KEY)).await).await;
    let rows = missing["data"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["status"], 404);
    let exact = json_of(
        get(
            &g.main,
            "/api/usage?status=404&model=nope-model",
            Some(OTHER_KEY),
        )
        .await,
    )
    .await;
    assert_eq!(exact["data"].as_array().unwrap().len(), 1);
    // An offset whose `+` arrives unencoded, a date, and unix seconds all work; milliseconds do not.
    for q in [
        "start=2020-01-01T05:30:00+05:30",
        "start=2020-01-01",
        "start=1577836800",
    ] {
        let page = json_of(
            get(
                &g.main,
                &format!("/api/usage?{q}&model=echo-1"),
                Some(OTHER_KEY),
            )
            .await,
        )
        .await;
        assert_eq!(page["data"].as_array().unwrap().len(), 2, "{q}");
    }
    for q in [
        "start=1577836800000",
        "order=sideways",
        "status=7xx",
        "limit=5&unknown=1",
    ] {
        let (status, e) =
            error_of(get(&g.main, &format!("/api/usage?{q}"), Some(OTHER_KEY)).await).await;
        assert_eq!(status, 400, "{q}");
        assert!(!e["message"].as_str().unwrap().is_empty());
    }
    let (_, e) =
        error_of(get(&g.main, "/api/usage?start=1577836800000", Some(OTHER_KEY)).await).await;
    assert!(
        e["message"].as_str().unwrap().contains("milliseconds"),
        "{e}"
    );
    // The CSV's file name carries the range.
    let resp = get(
        &g.main,
        "/api/usage.csv?start=2026-11-01&end=2026-11-02",
        Some(OTHER_KEY),
    )
    .await;
    assert_eq!(
        resp.headers()["content-disposition"],
        "attachment; filename=\"usage-other-20261101T000000Z-20261102T000000Z.csv\""
    );
}

/// Just past the newest record listed, so later calls stay out of the paged walk.
fn desc_end(page: &Value) -> String {
    let newest = page["data"][0]["time"].as_str().unwrap();
    let ms = newest.parse::<jiff::Timestamp>().unwrap().as_millisecond();
    jiff::Timestamp::from_millisecond(ms + 1)
        .unwrap()
        .to_string()
}

/// The request ids of a page's chat records, in its order (usage calls are records too).
fn chat_ids(page: &Value) -> Vec<Value> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["endpoint"] == "chat")
        .map(|r| r["request_id"].clone())
        .collect()
}

#[tokio::test]
async fn usage_queries_do_not_count_against_the_keys_rpm() {
    let g = start();
    for _ in 0..5 {
        json_of(get(&g.main, "/api/usage", Some(RPM2_KEY)).await).await;
        json_of(get(&g.direct, "/api/usage/summary", Some(RPM2_KEY)).await).await;
    }
    for _ in 0..2 {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(RPM2_KEY),
            &chat_body("echo-1", false),
            &[],
        )
        .await;
        assert_eq!(resp.status(), 200);
    }
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(RPM2_KEY),
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 429, "the third chat in a minute");
    // The refused chat is recorded with its endpoint group, known from the path.
    let chats = await_chat_records(&g.main, RPM2_KEY, 3).await;
    assert!(chats.iter().any(|r| r["status"] == 429), "{chats:?}");
}

#[tokio::test]
async fn wrong_keys_are_throttled_per_address_with_retry_after() {
    let g = start();
    for i in 0..10 {
        let (status, e) =
            error_of(get(&g.direct, "/api/usage", Some(&format!("sk-guess-{i}"))).await).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (401, Some("invalid_api_key")),
            "try {i}"
        );
    }
    for key in ["sk-guess-10", KEY] {
        let resp = get(&g.direct, "/api/usage/summary", Some(key)).await;
        let retry: u64 = resp.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        let (status, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (429, Some("rate_limit_exceeded")),
            "{key}"
        );
    }
    // Both listeners and the proxied API share the count.
    let (status, _) = error_of(get(&g.main, "/api/usage", Some(KEY)).await).await;
    assert_eq!(status, 429);
    let (status, _) = error_of(get(&g.main, "/v1/models", Some(KEY)).await).await;
    assert_eq!(status, 429);
    // No token at all is not a guess.
    let g2 = start();
    for _ in 0..15 {
        let (status, _) = error_of(get(&g2.direct, "/api/usage", None).await).await;
        assert_eq!(status, 401);
    }
}

#[tokio::test]
async fn billing_endpoints_answer_in_the_openai_shape() {
    let g = start();
    chats(&g.main, BUDGET_KEY, "echo-1", 2).await;
    let records = await_chat_records(&g.main, BUDGET_KEY, 2).await;
    let cost: f64 = records.iter().map(|r| r["cost"].as_f64().unwrap()).sum();
    for base in g.bases() {
        let sub = json_of(
            get(
                &base,
                "/v1/dashboard/billing/subscription",
                Some(BUDGET_KEY),
            )
            .await,
        )
        .await;
        assert_eq!(sub["object"], "billing_subscription");
        assert_eq!(sub["hard_limit_usd"], 10.0);
        assert_eq!(sub["soft_limit_usd"], 10.0);
        assert_eq!(sub["access_until"], 0);
        let unlimited =
            json_of(get(&base, "/v1/dashboard/billing/subscription", Some(KEY)).await).await;
        assert_eq!(unlimited["hard_limit_usd"], 100_000_000.0);
        let now = jiff::Timestamp::now();
        let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
        let tomorrow = today.tomorrow().unwrap();
        let usage = json_of(
            get(
                &base,
                &format!("/v1/dashboard/billing/usage?start_date={today}&end_date={tomorrow}"),
                Some(BUDGET_KEY),
            )
            .await,
        )
        .await;
        assert_eq!(usage["object"], "list");
        assert!(
            (usage["total_usage"].as_f64().unwrap() - cost * 100.0).abs() < 1e-6,
            "{usage}"
        );
        let days = usage["daily_costs"].as_array().unwrap();
        assert_eq!(days.len(), 1);
        let items = days[0]["line_items"].as_array().unwrap();
        assert!(items.iter().any(|i| i["name"] == "echo-1"), "{usage}");
        for q in [
            "start_date=2026-01-01&end_date=2026-12-31",
            "start_date=tomorrow",
            "begin=2026-01-01",
        ] {
            let (status, _) = error_of(
                get(
                    &base,
                    &format!("/v1/dashboard/billing/usage?{q}"),
                    Some(BUDGET_KEY),
                )
                .await,
            )
            .await;
            assert_eq!(status, 400, "{q}");
        }
        let (status, _) =
            error_of(get(&base, "/v1/dashboard/billing/subscription", None).await).await;
        assert_eq!(status, 401);
        let (status, e) = error_of(
            get(
                &base,
                "/v1/dashboard/billing/subscription",
                Some(MODELS_ONLY_KEY),
            )
            .await,
        )
        .await;
        assert_eq!((status, e["param"].as_str()), (403, Some("endpoint")));
    }
}
