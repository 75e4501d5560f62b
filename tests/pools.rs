//! Pools that keep answering: balancing, health, failover and retries, over real sockets with
//! several upstreams (the gateway's mock plus more `modelgate mock-upstream` processes).

mod common;

use common::*;

async fn chat_status(base: &str, model: &str) -> u16 {
    post_json(base, "/v1/chat/completions", &chat_body(model, false))
        .await
        .status()
        .as_u16()
}

async fn upstreams(g: &Gateway) -> serde_json::Value {
    let resp = reqwest::get(format!("{}/upstreams", g.admin))
        .await
        .expect("admin");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

/// The pool's upstreams as the admin listener shows them, by URL.
fn pool<'a>(view: &'a serde_json::Value, name: &str) -> &'a Vec<serde_json::Value> {
    view["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .and_then(|p| p["upstreams"].as_array())
        .expect("pool in /upstreams")
}

#[tokio::test]
async fn a_dead_upstream_is_skipped_and_the_live_one_answers_every_request() {
    let g = start_with(Setup {
        extra_config: r#"
[[pools]]
name = "mixed"
upstreams = ["http://127.0.0.1:@DEAD@", "http://127.0.0.1:@MOCK@"]
retry_base_ms = 10

[[models]]
name = "mixed-model"
pool = "mixed"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    for i in 0..12 {
        let base = &g.bases()[i % 2];
        assert_eq!(chat_status(base, "mixed-model").await, 200, "request {i}");
    }
    let view = upstreams(&g).await;
    let ups = pool(&view, "mixed");
    assert_eq!(ups[0]["healthy"], false, "{view}");
    assert!(ups[0]["failures"].as_u64() >= Some(1), "{view}");
    assert!(ups[0]["cooldown_remaining_ms"].as_u64() > Some(0), "{view}");
    assert_eq!(ups[1]["healthy"], true, "{view}");
    assert_eq!(ups[1]["requests"].as_u64(), Some(12), "{view}");
}

#[tokio::test]
async fn killing_one_of_two_upstreams_costs_no_client_an_error() {
    let second = start_mock(&[]);
    let g = start_with(Setup {
        extra_config: format!(
            r#"
[[pools]]
name = "pair"
upstreams = ["http://127.0.0.1:@MOCK@", "http://127.0.0.1:{}"]
retry_base_ms = 10

[[models]]
name = "pair-model"
pool = "pair"
upstream_model = "echo-1"
"#,
            second.port
        ),
        ..Setup::default()
    });
    for i in 0..6 {
        assert_eq!(chat_status(&g.main, "pair-model").await, 200, "before, {i}");
    }
    let before = upstreams(&g).await;
    assert_eq!(pool(&before, "pair")[1]["requests"].as_u64(), Some(3));
    drop(second);
    for i in 0..20 {
        assert_eq!(
            chat_status(&g.direct, "pair-model").await,
            200,
            "after, {i}"
        );
    }
    let after = upstreams(&g).await;
    assert_eq!(pool(&after, "pair")[1]["healthy"], false, "{after}");
}

#[tokio::test]
async fn a_weighted_pool_spreads_requests_by_weight() {
    let second = start_mock(&[]);
    let g = start_with(Setup {
        extra_config: format!(
            r#"
[[pools]]
name = "weighted"
strategy = "weighted"
upstreams = [{{ url = "http://127.0.0.1:@MOCK@", weight = 3 }}, {{ url = "http://127.0.0.1:{}", weight = 1 }}]

[[models]]
name = "weighted-model"
pool = "weighted"
upstream_model = "echo-1"
"#,
            second.port
        ),
        ..Setup::default()
    });
    for _ in 0..40 {
        assert_eq!(chat_status(&g.main, "weighted-model").await, 200);
    }
    let view = upstreams(&g).await;
    let ups = pool(&view, "weighted");
    assert_eq!(
        (ups[0]["requests"].as_u64(), ups[1]["requests"].as_u64()),
        (Some(30), Some(10)),
        "{view}"
    );
    let strategy = view["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "weighted"))
        .map(|p| p["strategy"].clone());
    assert_eq!(strategy, Some(serde_json::json!("weighted")), "{view}");
}
