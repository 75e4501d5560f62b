//! Pools that keep answering: balancing, health, failover and retries, over real sockets with
//! several upstreams (the gateway's mock plus more `modelgate mock-upstream` processes).
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

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
pass_headers = ["x-mock-*"]
name = "mixed"
upstreams = ["http://127.0.0.1:@DEAD@", "http://127.0.0.1:@MOCK@"]
retry_base_ms = 10
health_interval_ms = 0  # only requests find it dead (a check at start could be first)

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
pass_headers = ["x-mock-*"]
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
pass_headers = ["x-mock-*"]
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

/// Asks the admin listener until `ready` holds for the view (the health checker runs on its
/// own clock), failing after `within`.
async fn await_view(
    g: &Gateway,
    within: std::time::Duration,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    eventually_async(within, "not reached", async || {
        let view = upstreams(g).await;
        if ready(&view) {
            Ok(view)
        } else {
            Err(view.to_string())
        }
    })
    .await
}

#[tokio::test]
async fn the_health_check_takes_a_dead_upstream_out_and_brings_it_back() {
    let second = start_mock(&[]);
    let port = second.port;
    let g = start_with(Setup {
        extra_config: format!(
            r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "checked"
upstreams = ["http://127.0.0.1:@MOCK@", "http://127.0.0.1:{port}"]
health_interval_ms = 100
cooldown_ms = 600000

[[models]]
name = "checked-model"
pool = "checked"
upstream_model = "echo-1"
"#
        ),
        ..Setup::default()
    });
    let within = std::time::Duration::from_secs(5);
    drop(second);
    // No request has gone to it: the check alone takes it out.
    let view = await_view(&g, within, |v| {
        pool(v, "checked")[1]["check_failed"] == true
    })
    .await;
    assert_eq!(pool(&view, "checked")[1]["requests"], 0, "{view}");
    for _ in 0..6 {
        assert_eq!(chat_status(&g.main, "checked-model").await, 200);
    }
    let again = start_mock_at(port, &[]);
    await_view(&g, within, |v| pool(v, "checked")[1]["healthy"] == true).await;
    for _ in 0..6 {
        assert_eq!(chat_status(&g.main, "checked-model").await, 200);
    }
    let view = upstreams(&g).await;
    assert!(
        pool(&view, "checked")[1]["requests"].as_u64() >= Some(2),
        "{view}"
    );
    drop(again);
}

#[tokio::test]
async fn a_500_then_recovery_is_retried_with_backoff_and_the_record_counts_the_tries() {
    let g = start_with(Setup {
        extra_config: r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "flaky"
upstreams = ["http://127.0.0.1:@MOCK@"]
retry_base_ms = 100
retry_cap_ms = 1000

[[models]]
name = "flaky-model"
pool = "flaky"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    for (status, fails) in [("500", 2), ("429", 1)] {
        let started = std::time::Instant::now();
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body("flaky-model", false),
            &[
                ("x-mock-status", status),
                ("x-mock-fail-first", &fails.to_string()),
            ],
        )
        .await;
        let elapsed = started.elapsed();
        assert_eq!(resp.status(), 200, "{status}");
        let id = request_id(&resp);
        // Waits of 100 ms, then 200 ms, each plus up to 10%.
        let least = if fails == 2 { 300 } else { 100 };
        assert!(
            elapsed >= std::time::Duration::from_millis(least),
            "{elapsed:?}"
        );
        assert!(
            elapsed < std::time::Duration::from_millis(least * 11 / 10 + 1_500),
            "{elapsed:?}"
        );
        let r = await_record(&g, &id).await;
        assert_eq!(r["attempts"], fails + 1, "{r}");
        assert_eq!(r["status"], 200, "{r}");
    }
    // A 400 is the client's: never retried.
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("flaky-model", false),
        &[("x-mock-status", "400"), ("x-mock-fail-first", "1")],
    )
    .await;
    assert_eq!(resp.status(), 400);
    let id = request_id(&resp);
    assert_eq!(await_record(&g, &id).await["attempts"], 1);
}

#[tokio::test]
async fn a_model_whose_pool_is_down_falls_back_and_the_record_says_which_answered() {
    let g = start_with(Setup {
        extra_config: r#"
[[models]]
name = "primary-model"
pool = "dead"
fallbacks = ["big-model"]
price = { request = 1.0 }

[[models]]
name = "primary-of-echo"
pool = "dead"
fallbacks = ["echo-1"]
"#
        .into(),
        ..Setup::default()
    });
    for base in g.bases() {
        let resp = post_json(
            &base,
            "/v1/chat/completions",
            &chat_body("primary-model", false),
        )
        .await;
        assert_eq!(resp.status(), 200);
        // The fallback's upstream name went upstream.
        assert_eq!(resp.headers()["x-mock-model"], "upstream/big-model-v2");
        let id = request_id(&resp);
        let r = await_record(&g, &id).await;
        assert_eq!(
            (r["model"].as_str(), r["served_model"].as_str()),
            (Some("primary-model"), Some("big-model")),
            "{r}"
        );
        // A fallback without `upstream_model` goes upstream under its own name, not the one
        // the client asked for.
        let resp = post_json(
            &base,
            "/v1/chat/completions",
            &chat_body("primary-of-echo", true),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-mock-model"], "echo-1");
        let _ = resp.bytes().await;
    }
    // The metrics count them under the model asked for, as the records do.
    let (others, m) = eventually_async(
        std::time::Duration::from_secs(5),
        "4 requests not counted under the models asked for",
        async || {
            let m = metrics_text(&g).await;
            let requests: Vec<&str> = m
                .lines()
                .filter(|l| l.starts_with("modelgate_requests_total{"))
                .collect();
            let count = |model: &str| {
                requests
                    .iter()
                    .filter(|l| l.contains(&format!("model=\"{model}\"")))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
            };
            if count("primary-model") + count("primary-of-echo") >= 4.0 {
                let others = count("big-model") + count("echo-1");
                Ok((others, m))
            } else {
                Err(m)
            }
        },
    )
    .await;
    assert_eq!(others, 0.0, "{m}");
}

/// A fallback is no way around a key's model allow-list: a key allowed only the primary is not
/// served by its fallback (nor billed at the fallback's price) when the primary's pool is down.
#[tokio::test]
async fn a_fallback_the_key_may_not_use_is_not_taken() {
    let g = start_with(Setup {
        extra_config: r#"
[[models]]
name = "primary-model"
pool = "dead"
fallbacks = ["big-model"]
"#
        .into(),
        extra_keys: "[[keys]]\nid = \"primary-only\"\nsecret = \"sk-test-primary-only-0097\"\nmodels = [\"primary-*\"]\n".into(),
        ..Setup::default()
    });
    let key = "sk-test-primary-only-0097";
    let direct = send(
        &g.main,
        "/v1/chat/completions",
        Some(key),
        &chat_body("big-model", false),
        &[],
    )
    .await;
    assert_eq!(error_of(direct).await.0, 403);
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(key),
        &chat_body("primary-model", false),
        &[],
    )
    .await;
    let id = request_id(&resp);
    let (status, e) = error_of(resp).await;
    // The dead pool's own answer: refused at connect (502), or out of rotation (503).
    assert!(
        matches!(
            (status, e["code"].as_str()),
            (502, Some("upstream_error")) | (503, Some("no_healthy_upstream"))
        ),
        "{status} {e}"
    );
    let r = await_key_record(
        &client(),
        &g.direct,
        key,
        &id,
        std::time::Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        (r["status"].as_u64(), r["cost"].as_f64()),
        (Some(u64::from(status)), Some(0.0)),
        "{r}"
    );
    assert_ne!(r["served_model"], "big-model", "{r}");
    // A key that may use both is served by the fallback.
    let resp = post_json(
        &g.main,
        "/v1/chat/completions",
        &chat_body("primary-model", false),
    )
    .await;
    assert_eq!(resp.status(), 200);
}

/// A stand-in upstream on a raw socket that answers one stream's first event and then waits:
/// it reports how long after `since` it saw the gateway close the connection.
fn hanging_stream_upstream() -> (u16, std::sync::mpsc::Receiver<std::time::Instant>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                if !String::from_utf8_lossy(&seen).starts_with("POST") {
                    // The health check's GET /v1/models.
                    let _ =
                        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"data\":[]}");
                    return;
                }
                let event = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                    event.len()
                );
                let _ = s.write_all(head.as_bytes());
                // Then nothing more, until the gateway closes the connection.
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                let _ = tx.send(std::time::Instant::now());
            });
        }
    });
    (port, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_cancels_makes_the_gateway_close_the_upstream_within_a_second() {
    let (port, closed) = hanging_stream_upstream();
    // (`on_client_gone = "cancel"`: by default the reply would be read on for its usage.)
    let g = start_with(Setup {
        server_extra: "on_client_gone = \"cancel\"".into(),
        extra_config: format!(
            r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "hanging"
upstreams = ["http://127.0.0.1:{port}"]

[[models]]
name = "hanging-model"
pool = "hanging"
"#
        ),
        ..Setup::default()
    });
    for base in g.bases() {
        let mut resp = client()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("hanging-model", true))
            .send()
            .await
            .expect("stream starts");
        assert_eq!(resp.status(), 200);
        let first = resp.chunk().await.expect("first event").expect("some");
        assert!(String::from_utf8_lossy(&first).contains("hi"));
        let id = request_id(&resp);
        let cancelled = std::time::Instant::now();
        drop(resp);
        let at =
            tokio::task::block_in_place(|| closed.recv_timeout(std::time::Duration::from_secs(5)))
                .expect("the upstream never saw the close");
        let took = at.duration_since(cancelled);
        assert!(took < std::time::Duration::from_secs(1), "{took:?}");
        let r = await_record(&g, &id).await;
        assert_eq!(r["status"], 499, "{r}");
        assert!(
            r["completion_tokens"].as_u64() > Some(0),
            "tokens so far: {r}"
        );
    }
}

async fn metric(g: &Gateway, name: &str) -> f64 {
    metric_value(g, name).await
}

/// Waits up to `secs` for a config reload to be refused (`what` if none is).
async fn await_reload_refused(g: &Gateway, secs: u64, what: &str) {
    eventually_async(std::time::Duration::from_secs(secs), what, async || {
        if metric(g, "modelgate_config_reload_errors_total").await < 1.0 {
            Err(String::new())
        } else {
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn pools_and_models_reload_from_the_config_file_and_a_bad_file_keeps_them() {
    let g = start();
    assert_eq!(chat_status(&g.main, "late-model").await, 404);
    let path = g.dir.path().join("modelgate.toml");
    let good = std::fs::read_to_string(&path).expect("config");
    let added = format!(
        "{good}\n[[models]]\nname = \"late-model\"\npool = \"local\"\nupstream_model = \"echo-1\"\n"
    );
    std::fs::write(&path, &added).expect("write");
    eventually_async(
        std::time::Duration::from_secs(3),
        "the new model never answered",
        async || match chat_status(&g.main, "late-model").await {
            200 => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
    // A file that does not load: the pools and models in force stay.
    std::fs::write(
        &path,
        format!("{added}\n[[models]]\nname = \"broken\"\npool = \"nope\"\n"),
    )
    .expect("write");
    await_reload_refused(&g, 3, "the bad file was not rejected").await;
    assert_eq!(chat_status(&g.direct, "late-model").await, 200);
    assert_eq!(chat_status(&g.direct, "broken").await, 404);
}

#[tokio::test]
async fn a_hanging_upstream_times_out_and_the_others_take_over() {
    // Accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    let g = start_with(Setup {
        extra_config: format!(
            r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "half-hung"
upstreams = ["http://127.0.0.1:{port}", "http://127.0.0.1:@MOCK@"]
first_byte_timeout_ms = 300
retry_base_ms = 10
health_interval_ms = 0

[[models]]
name = "half-hung-model"
pool = "half-hung"
upstream_model = "echo-1"
"#
        ),
        ..Setup::default()
    });
    let started = std::time::Instant::now();
    for i in 0..6 {
        assert_eq!(
            chat_status(&g.main, "half-hung-model").await,
            200,
            "request {i}"
        );
    }
    // Only the first request waited for the hung one: it is then out for its cool-down.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let view = upstreams(&g).await;
    assert_eq!(pool(&view, "half-hung")[0]["healthy"], false, "{view}");
    assert_eq!(pool(&view, "half-hung")[0]["requests"], 1, "{view}");
}

#[tokio::test]
async fn readyz_says_ready_until_a_pool_has_no_healthy_upstream_and_names_it() {
    let g = start_with(Setup {
        extra_config: ALL_DEAD_POOL.into(),
        ..Setup::default()
    });
    let ready = |g: &Gateway| {
        let url = format!("{}/readyz", g.admin);
        async move {
            let resp = reqwest::get(url).await.expect("readyz");
            let status = resp.status().as_u16();
            (
                status,
                resp.json::<serde_json::Value>().await.expect("json"),
            )
        }
    };
    let (status, body) = ready(&g).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(chat_status(&g.main, "all-dead-model").await, 502);
    let (status, body) = ready(&g).await;
    assert_eq!(status, 503, "{body}");
    let reasons = body["reasons"].to_string();
    assert!(
        reasons.contains("pool 'all-dead' has no healthy upstream"),
        "{body}"
    );
    // Liveness is not readiness.
    let live = reqwest::get(format!("{}/healthz", g.admin))
        .await
        .expect("healthz");
    assert_eq!(live.status(), 200);
}

#[tokio::test]
async fn retry_after_is_waited_out_within_the_cap_and_passed_on_beyond_it() {
    let g = start_with(Setup {
        extra_config: r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "limited"
upstreams = ["http://127.0.0.1:@MOCK@"]
retry_base_ms = 10
retry_cap_ms = 2000

[[models]]
name = "limited-model"
pool = "limited"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    let ask = |retry_after: &'static str| {
        let base = g.main.clone();
        async move {
            let started = std::time::Instant::now();
            let resp = send(
                &base,
                "/v1/chat/completions",
                Some(KEY),
                &chat_body("limited-model", false),
                &[
                    ("x-mock-status", "429"),
                    ("x-mock-fail-first", "1"),
                    ("x-mock-retry-after", retry_after),
                ],
            )
            .await;
            (resp.status().as_u16(), started.elapsed())
        }
    };
    // The only upstream asked for 1 s, within the 2 s cap: the retry waits for it.
    let (status, took) = ask("1").await;
    assert_eq!(status, 200);
    assert!(took >= std::time::Duration::from_millis(1000), "{took:?}");
    // It asked for 60 s, beyond the cap, and no other upstream can take it: the 429 goes to
    // the client at once, for the client to wait.
    let (status, took) = ask("60").await;
    assert_eq!(status, 429);
    assert!(took < std::time::Duration::from_millis(900), "{took:?}");
}

/// The upstream connection a request came on (its source address, as the mock saw it).
async fn connection_of(g: &Gateway, model: &str) -> String {
    let resp = post_json(&g.main, "/v1/chat/completions", &chat_body(model, false)).await;
    assert_eq!(resp.status(), 200);
    let peer = resp.headers()["x-mock-peer"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert!(!peer.is_empty());
    peer
}

#[tokio::test]
async fn upstream_connections_are_reused_until_the_pools_keepalive_timeout() {
    let g = start_with(Setup {
        extra_config: r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "kept"
upstreams = ["http://127.0.0.1:@MOCK@"]
health_interval_ms = 0

[[pools]]
pass_headers = ["x-mock-*"]
name = "short"
upstreams = ["http://127.0.0.1:@MOCK@"]
health_interval_ms = 0
keepalive_timeout_ms = 300

[[pools]]
pass_headers = ["x-mock-*"]
name = "none"
upstreams = ["http://127.0.0.1:@MOCK@"]
health_interval_ms = 0
keepalive_timeout_ms = 0

[[models]]
name = "kept-model"
pool = "kept"
upstream_model = "echo-1"

[[models]]
name = "short-model"
pool = "short"
upstream_model = "echo-1"

[[models]]
name = "none-model"
pool = "none"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    // The default (60 s): one connection for requests one after another.
    let first = connection_of(&g, "kept-model").await;
    for _ in 0..3 {
        assert_eq!(connection_of(&g, "kept-model").await, first);
    }
    // 0: each connection is closed after its reply, so the next one is new.
    let a = connection_of(&g, "none-model").await;
    let b = connection_of(&g, "none-model").await;
    let c = connection_of(&g, "none-model").await;
    assert!(a != b && b != c, "{a} {b} {c}");
    // 300 ms: reused right away, closed once it waited that long unused.
    let a = connection_of(&g, "short-model").await;
    assert_eq!(connection_of(&g, "short-model").await, a);
    // Waiting out the timeout is what is tested; nothing to await instead.
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    assert_ne!(connection_of(&g, "short-model").await, a);
}

#[tokio::test]
async fn a_reused_connection_the_upstream_closed_is_replaced_within_the_same_try() {
    let g = start_with(Setup {
        extra_config: r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "once"
upstreams = ["http://127.0.0.1:@MOCK@"]
health_interval_ms = 0
max_attempts = 1

[[models]]
name = "once-model"
pool = "once"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    let ask = |close_next: bool| {
        let base = g.main.clone();
        async move {
            let headers: &[(&str, &str)] = if close_next {
                &[("x-mock-close-next", "1")]
            } else {
                &[]
            };
            let body = chat_body("once-model", false);
            let resp = send(&base, "/v1/chat/completions", Some(KEY), &body, headers).await;
            assert_eq!(resp.status(), 200);
            let header = |name: &str| resp.headers()[name].to_str().expect("ascii").to_string();
            (header("x-mock-peer"), header("x-request-id"))
        }
    };
    // Answered, and the connection kept; the upstream will close it when the next request
    // comes on it, as a server whose keep-alive ran out does.
    let (first, _) = ask(true).await;
    let stale = metric(&g, "modelgate_upstream_connections_stale_total").await;
    // One try only: without the new connection within the try, this would be a 502.
    let (second, id) = ask(false).await;
    assert_ne!(second, first, "the closed connection was replaced");
    let r = await_record(&g, &id).await;
    assert_eq!(r["attempts"], 1, "{r}");
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(
        metric(&g, "modelgate_upstream_connections_stale_total").await,
        stale + 1.0
    );
    // Not the upstream's failure: it stays in rotation with nothing against it.
    let view = upstreams(&g).await;
    let up = &pool(&view, "once")[0];
    assert_eq!(up["healthy"], true, "{view}");
    assert_eq!(up["failures"], 0, "{view}");
    // The new connection is the one kept now.
    assert_eq!(ask(false).await.0, second);
    // An upstream that takes the request and falls over 800 ms later (past the half second
    // within which a close can only be a stale connection's) may have acted on it: not sent
    // again. The one try failed: 502.
    let body = chat_body("once-model", false);
    let closes = [("x-mock-close-next", "800")];
    let resp = send(&g.main, "/v1/chat/completions", Some(KEY), &body, &closes).await;
    assert_eq!(resp.status(), 200);
    let resp = send(&g.main, "/v1/chat/completions", Some(KEY), &body, &[]).await;
    assert_eq!(resp.status(), 502);
    let id = request_id(&resp);
    assert_eq!(await_record(&g, &id).await["attempts"], 1);
    assert_eq!(
        metric(&g, "modelgate_upstream_connections_stale_total").await,
        stale + 1.0
    );
}

/// `idle_timeout_ms` ends a stream that goes quiet between events (the reply has begun: it is
/// cut, never a [DONE]), and `request_timeout_ms` bounds the whole of a plain reply, its wait
/// for the header included: 504 `upstream_timeout`, each within its own limit, not the
/// other limits' (30 s and 5 s here).
#[tokio::test]
async fn idle_and_whole_request_timeouts_each_end_their_reply() {
    let g = start_with(Setup {
        extra_config: r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "strict"
upstreams = ["http://127.0.0.1:@MOCK@"]
health_interval_ms = 0
first_byte_timeout_ms = 5000
idle_timeout_ms = 300
request_timeout_ms = 600
max_attempts = 1

[[models]]
name = "strict-model"
pool = "strict"
upstream_model = "echo-1"

[[pools]]
pass_headers = ["x-mock-*"]
name = "strict-retry"
upstreams = ["http://127.0.0.1:@MOCK@"]
health_interval_ms = 0
request_timeout_ms = 500
retry_base_ms = 5000
retry_cap_ms = 5000

[[models]]
name = "strict-retry-model"
pool = "strict-retry"
upstream_model = "echo-1"
"#
        .into(),
        ..Setup::default()
    });
    let started = std::time::Instant::now();
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("strict-model", true),
        &[("x-mock-delay-ms", "2000"), ("x-mock-chunks", "3")],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let text = resp.text().await.unwrap_or_default();
    assert!(
        !text.contains("[DONE]"),
        "a quiet stream looked complete: {text}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_millis(1800),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(await_record(&g, &id).await["status"], 504);

    let started = std::time::Instant::now();
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("strict-model", false),
        &[("x-mock-delay-ms", "3000")],
    )
    .await;
    let (status, e) = error_of(resp).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (504, Some("upstream_timeout")),
        "{e}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_millis(2000),
        "{:?}",
        started.elapsed()
    );
    // A retry's backoff (5 s here) is cut short by the whole deadline: at about 0.5 s the
    // next try is the last; its reply (the mock's 503, if quicker than the 10 ms timer tick)
    // or the 504 ends the request.
    let started = std::time::Instant::now();
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("strict-retry-model", false),
        &[("x-mock-status", "503")],
    )
    .await;
    let (status, e) = error_of(resp).await;
    assert!(
        [(503, Some("mock_error")), (504, Some("upstream_timeout"))]
            .contains(&(status, e["code"].as_str())),
        "{status} {e}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
}

/// An upstream that sends `103 Early Hints` before each reply (as a CDN in front of a model
/// server may) stays in rotation: its health check reads past the informational reply to the
/// 200, as requests do.
#[tokio::test]
async fn an_upstream_that_sends_early_hints_passes_its_health_check() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    // A server of its own (not the mock): every request gets a 103, then the model list.
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let body = r#"{"object":"list","data":[]}"#;
                let reply = format!(
                    "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n\
                     HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
                while let Ok(n @ 1..) = s.read(&mut buf).await {
                    got.extend_from_slice(&buf[..n]);
                    // Each check is a GET: its header is the whole request.
                    while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        got.drain(..end + 4);
                        if s.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    let g = start_with(Setup {
        extra_config: format!(
            "[[pools]]\nname = \"hinted\"\nupstreams = [\"http://127.0.0.1:{port}\"]\n\
             health_interval_ms = 300\n"
        ),
        ..Setup::default()
    });
    // Three checks answered: the first two have had their verdicts (each one that read 103
    // as the reply took the upstream out of rotation).
    eventually_async(
        Duration::from_secs(10),
        "the health check did not run",
        async || match answered.load(Ordering::SeqCst) {
            n if n < 3 => Err(format!("{n} checks answered")),
            _ => Ok(()),
        },
    )
    .await;
    // Ready after its last check (one the loaded machine let run past its deadline would
    // count as failed until the next).
    eventually_async(Duration::from_secs(5), "not ready", async || {
        let resp = reqwest::get(format!("{}/readyz", g.admin))
            .await
            .expect("readyz");
        let status = resp.status().as_u16();
        let body = resp.text().await.expect("body");
        if status == 200 {
            Ok(())
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await;
}

/// A reload that brings the first TLS upstream while the trust store cannot be loaded (the
/// bundle `SSL_CERT_FILE` names was overwritten since the start) is refused, and the pools in
/// force stay: the TLS connector it would have made panics on such a store.
#[tokio::test]
async fn a_reload_bringing_tls_upstreams_is_refused_while_the_trust_store_cannot_be_loaded() {
    let pki = common::pki::Pki::new("reload-ca");
    let bundle = pki.dir.path().join("bundle.pem");
    std::fs::write(&bundle, pki.ca_pem()).expect("write");
    let mut g = start_with(Setup {
        env: vec![("SSL_CERT_FILE".into(), bundle.display().to_string())],
        ..Setup::default()
    });
    assert_eq!(chat_status(&g.main, "echo-1").await, 200);
    std::fs::write(
        &bundle,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .expect("write");
    let path = g.dir.path().join("modelgate.toml");
    let good = std::fs::read_to_string(&path).expect("config");
    let dead = g.dead_port();
    std::fs::write(
        &path,
        format!(
            "{good}\n[[pools]]\nname = \"secure\"\nupstreams = [\"https://127.0.0.1:{dead}\"]\n\
             [[models]]\nname = \"secure-model\"\npool = \"secure\"\n"
        ),
    )
    .expect("write");
    await_reload_refused(&g, 5, "the reload was not refused").await;
    assert!(g.running(), "the gateway went down");
    assert_eq!(chat_status(&g.main, "echo-1").await, 200);
    assert_eq!(chat_status(&g.main, "secure-model").await, 404);
    let err = g.stop_and_stderr();
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("trust store for TLS upstreams"), "{err}");
}
