//! `/metrics` after a mixed run: every counter matches the requests made (by listener,
//! endpoint, model and status; refusals by reason; tokens; attempts and retries by upstream;
//! failed authentications by client address, and their throttle), the histograms counted
//! every request, and the store's, upstreams' and process's series are there.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

/// One sample: its name, labels and value.
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once("=\"")?;
                    Some((k.to_string(), v.trim_end_matches('"').to_string()))
                })
                .collect();
            Some(Sample {
                name: name.to_string(),
                labels,
                value: value.parse().ok()?,
            })
        })
        .collect()
}

/// The sum of the samples named `name` whose labels include `want`.
fn sum(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            want.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

async fn scrape(g: &Gateway) -> Vec<Sample> {
    let resp = reqwest::get(format!("{}/metrics", g.admin))
        .await
        .expect("metrics");
    assert_eq!(resp.status(), 200);
    parse(&resp.text().await.expect("text"))
}

#[tokio::test]
async fn a_scrape_after_a_mixed_run_matches_the_requests_made() {
    let g = start_with(Setup {
        extra_config: r#"
[metrics]
key_label = true

[[pools]]
pass_headers = ["x-mock-*"]
name = "mixed"
upstreams = ["http://127.0.0.1:@DEAD@", "http://127.0.0.1:@MOCK@"]
strategy = "round_robin"
health_interval_ms = 0
retry_base_ms = 10

[[models]]
name = "mixed-model"
pool = "mixed"
upstream_model = "echo-1"
"#
        .into(),
        server_extra: String::new(),
        ..Setup::default()
    });
    // 3 chats on main, 2 on direct (one streamed): 200, 8 completion tokens each.
    for (base, stream) in [
        (&g.main, false),
        (&g.main, false),
        (&g.main, true),
        (&g.direct, false),
        (&g.direct, false),
    ] {
        let resp = post_json(base, "/v1/chat/completions", &chat_body("echo-1", stream)).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.expect("body");
    }
    // Refusals: an unknown model, a model the key may not use, the third request of an rpm=2 key.
    let resp = post_json(&g.main, "/v1/chat/completions", &chat_body("nope", false)).await;
    assert_eq!(resp.status(), 404);
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(ECHO_ONLY_KEY),
        &chat_body("big-model", false),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 403);
    for expect in [200, 200, 429] {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(RPM2_KEY),
            &chat_body("echo-1", false),
            &[],
        )
        .await;
        assert_eq!(resp.status(), expect);
    }
    // Two requests to a pool whose first upstream is dead: every one answered.
    for _ in 0..2 {
        let resp = post_json(
            &g.main,
            "/v1/chat/completions",
            &chat_body("mixed-model", false),
        )
        .await;
        assert_eq!(resp.status(), 200);
    }
    // 10 wrong keys (the default limit), then the address is throttled even with a good key
    // it has not used before.
    for i in 0..10 {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(&format!("sk-wrong-{i}")),
            &chat_body("echo-1", false),
            &[],
        )
        .await;
        assert_eq!(resp.status(), 401, "try {i}");
    }
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(OTHER_KEY),
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    let made = 5 + 2 + 3 + 2 + 10 + 1;

    // Counters move as each request ends (after its reply): wait for the last one.
    let m = common::eventually_async(
        Duration::from_secs(10),
        "requests not all counted, or no batch committed",
        async || {
            let m = scrape(&g).await;
            // The store commits in batches: wait for one too.
            let committed = sum(&m, "modelgate_usage_batch_rows_count", &[]) >= 1.0;
            if sum(&m, "modelgate_requests_total", &[]) >= made as f64 && committed {
                Ok(m)
            } else {
                Err(format!(
                    "requests counted: {}",
                    sum(&m, "modelgate_requests_total", &[])
                ))
            }
        },
    )
    .await;
    let req = |want: &[(&str, &str)]| sum(&m, "modelgate_requests_total", want);
    assert_eq!(req(&[]), made as f64);
    assert_eq!(
        req(&[
            ("listener", "main"),
            ("endpoint", "chat"),
            ("model", "echo-1"),
            ("status", "200")
        ]),
        3.0 + 2.0
    );
    assert_eq!(
        req(&[
            ("listener", "direct"),
            ("model", "echo-1"),
            ("status", "200")
        ]),
        2.0
    );
    assert_eq!(req(&[("model", "mixed-model"), ("status", "200")]), 2.0);
    assert_eq!(req(&[("status", "401")]), 10.0);
    let refused = |status: &str, reason: &str| {
        sum(
            &m,
            "modelgate_refusals_total",
            &[("status", status), ("reason", reason)],
        )
    };
    assert_eq!(refused("404", "model_not_found"), 1.0);
    assert_eq!(refused("403", "permission_denied"), 1.0);
    assert_eq!(refused("429", "rpm"), 1.0);
    assert_eq!(refused("401", "invalid_api_key"), 10.0);
    assert_eq!(refused("429", "auth_failures"), 1.0);
    assert_eq!(
        sum(
            &m,
            "modelgate_auth_failures_total",
            &[("client", "127.0.0.1")]
        ),
        10.0
    );

    // 9 answered chats of 8 completion tokens (5 + 2 of rpm2 + 2 mixed).
    assert_eq!(
        sum(&m, "modelgate_tokens_total", &[("kind", "completion")]),
        72.0
    );
    assert_eq!(
        sum(
            &m,
            "modelgate_tokens_total",
            &[("kind", "completion"), ("model", "mixed-model")]
        ),
        16.0
    );
    assert_eq!(
        sum(&m, "modelgate_key_requests_total", &[("key", "full")]),
        5.0 + 1.0 + 2.0,
        "the throttled request never got to its key"
    );
    assert_eq!(
        sum(&m, "modelgate_key_requests_total", &[("key", "rpm2")]),
        3.0
    );

    // Every proxied request was timed; the dead upstream's tries failed and were retried.
    assert_eq!(
        sum(&m, "modelgate_gateway_overhead_seconds_count", &[]),
        9.0
    );
    assert_eq!(
        sum(&m, "modelgate_request_duration_seconds_count", &[]),
        made as f64
    );
    assert_eq!(
        sum(&m, "modelgate_time_to_first_token_seconds_count", &[]),
        9.0
    );
    assert_eq!(
        sum(
            &m,
            "modelgate_upstream_duration_seconds_count",
            &[("pool", "mixed")]
        ),
        2.0
    );
    let dead = format!("http://127.0.0.1:{}", g.dead_port());
    let attempts = |upstream: &str, outcome: &str| {
        sum(
            &m,
            "modelgate_upstream_attempts_total",
            &[
                ("pool", "mixed"),
                ("upstream", upstream),
                ("outcome", outcome),
            ],
        )
    };
    let live = g.mock.clone();
    assert_eq!(attempts(&live, "2xx"), 2.0);
    assert!(
        attempts(&dead, "error") >= 1.0,
        "the dead upstream's failed tries"
    );
    assert_eq!(
        sum(&m, "modelgate_upstream_retries_total", &[("pool", "mixed")]),
        attempts(&dead, "error")
    );
    assert_eq!(
        sum(
            &m,
            "modelgate_upstream_healthy",
            &[("pool", "mixed"), ("upstream", &dead)]
        ),
        0.0
    );
    assert_eq!(
        sum(
            &m,
            "modelgate_upstream_healthy",
            &[("pool", "mixed"), ("upstream", &live)]
        ),
        1.0
    );

    // The store, the reloads' state and the process.
    assert!(sum(&m, "modelgate_usage_batch_rows_count", &[]) >= 1.0);
    assert!(sum(&m, "modelgate_usage_batch_duration_seconds_count", &[]) >= 1.0);
    assert_eq!(sum(&m, "modelgate_keys", &[]), 11.0);
    assert!(sum(&m, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(sum(&m, "process_open_fds", &[]) > 0.0);
    // To the clock tick (whole seconds read 0 for a gateway that had used less than one).
    assert!(sum(&m, "process_cpu_seconds_total", &[]) > 0.0);
}

/// The gateway's own pages and the console are counted as what they are, not as the usage
/// API (a failed console sign-in looked like a usage call refused).
#[tokio::test]
async fn pages_the_console_and_unknown_paths_have_their_own_endpoint_label() {
    let g = start();
    for (base, path, group) in [
        (&g.direct, "/", "page"),
        (&g.main, "/console/login", "console"),
        (&g.direct, "/favicon-nothing.ico", "none"),
        (&g.direct, "/api/usage", "usage"),
    ] {
        let resp = get(base, path, Some(KEY)).await;
        let _ = resp.bytes().await;
        common::eventually_async(
            Duration::from_secs(5),
            &format!("{path}: no request counted as {group}"),
            async || {
                let n = sum(
                    &scrape(&g).await,
                    "modelgate_requests_total",
                    &[("endpoint", group)],
                );
                if n < 1.0 { Err(String::new()) } else { Ok(()) }
            },
        )
        .await;
    }
}

/// A stream counts as in flight on its upstream while it runs, and no longer once it has
/// ended, though its client's connection stays open for more requests (the stream went on in a
/// task of its own, which then serves that connection: `proxy::detach`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_counts_in_flight_on_its_upstream_until_it_ends() {
    let g = start();
    let in_flight = |samples: &[Sample]| sum(samples, "modelgate_upstream_in_flight", &[]);
    let body = r#"{"model":"echo-1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let head = chat_head(KEY, body.len(), "x-mock-delay-ms: 100\r\n") + body;
    let (mut s, _id) =
        tokio::task::block_in_place(|| stop_reading_after_the_header(&g.main, &head));
    assert_eq!(in_flight(&scrape(&g).await), 1.0);
    tokio::task::block_in_place(|| read_until_last_chunk(&mut s));
    // The count ends as the reply's last piece goes out; the connection is still open.
    common::eventually_async(
        Duration::from_secs(5),
        "still counted in flight",
        async || {
            let n = in_flight(&scrape(&g).await);
            if n == 0.0 {
                Ok(())
            } else {
                Err(format!("{n} in flight"))
            }
        },
    )
    .await;
    let models = tokio::task::block_in_place(|| models_over(&mut s));
    assert!(models.starts_with("HTTP/1.1 200"), "{models}");
}
