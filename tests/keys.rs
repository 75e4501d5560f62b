//! The keys file as the live control plane: exact frequency limits with honest 429s, shared by
//! both listeners, and hot reload (rewrite, symlink swap, broken file, SIGHUP) that leaves
//! requests in flight untouched.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use futures_util::StreamExt;

async fn chat(base: &str, key: &str) -> reqwest::Response {
    send(
        base,
        "/v1/chat/completions",
        Some(key),
        &chat_body("echo-1", false),
        &[],
    )
    .await
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[tokio::test]
async fn fifty_concurrent_clients_on_rpm_100_get_exactly_100_across_both_listeners() {
    let g = start();
    let c = client();
    let sends = (0..200).map(|i| {
        let c = c.clone();
        let base = if i % 2 == 0 {
            g.main.clone()
        } else {
            g.direct.clone()
        };
        async move {
            c.post(format!("{base}/v1/embeddings"))
                .bearer_auth(RPM100_KEY)
                .json(&serde_json::json!({"model": "echo-1", "input": "x"}))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    });
    // 50 at a time, as 50 clients would.
    let statuses: Vec<u16> = futures_util::stream::iter(sends)
        .buffer_unordered(50)
        .collect()
        .await;
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((ok, limited), (100, 100), "{statuses:?}");
}

#[tokio::test]
async fn a_429_says_when_to_retry_and_every_reply_of_a_limited_key_carries_the_headers() {
    let g = start();
    let first = chat(&g.main, RPM2_KEY).await;
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "x-ratelimit-limit-requests").as_deref(),
        Some("2")
    );
    assert_eq!(
        header(&first, "x-ratelimit-remaining-requests").as_deref(),
        Some("1")
    );
    assert!(header(&first, "x-ratelimit-reset-requests").is_some());
    let second = chat(&g.direct, RPM2_KEY).await;
    assert_eq!(
        header(&second, "x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    let third = chat(&g.main, RPM2_KEY).await;
    let retry: u64 = header(&third, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!(
        (58..=60).contains(&retry),
        "retry-after {retry}: the first admission leaves the window in ~60 s"
    );
    assert_eq!(
        header(&third, "x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    let (status, e) = error_of(third).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
    // Unlimited keys get no rate-limit headers.
    assert!(header(&chat(&g.main, KEY).await, "x-ratelimit-limit-requests").is_none());
}

#[tokio::test]
async fn tpm_counts_the_metered_tokens_and_refuses_while_the_window_is_full() {
    // Today's rule: tokens count when a reply ends (no reservation).
    let g = start_with(Setup {
        limits_extra: "budget_mode = \"after\"\n".into(),
        ..Setup::default()
    });
    // Each chat costs 12 tokens; the key has 20 a minute.
    let a = chat(&g.main, TPM_KEY).await;
    assert_eq!(a.status(), 200);
    assert_eq!(
        header(&a, "x-ratelimit-limit-tokens").as_deref(),
        Some("20")
    );
    let first = header(&a, "x-request-id").expect("request id");
    a.bytes().await.expect("body");
    // The first reply's tokens are counted just before its usage record is made: wait for the
    // record, so the next request sees them (12 of 20 used) and is admitted with 8 left.
    eventually_async(
        Duration::from_secs(5),
        "no record for the first request",
        async || {
            let page = get(&g.main, "/api/usage?limit=10000", Some(TPM_KEY)).await;
            let text = page.text().await.expect("page");
            if text.contains(&first) {
                Ok(())
            } else {
                Err(String::new())
            }
        },
    )
    .await;
    let second = chat(&g.direct, TPM_KEY).await;
    assert_eq!(second.status(), 200);
    assert_eq!(
        header(&second, "x-ratelimit-remaining-tokens").as_deref(),
        Some("8")
    );
    // With tokens counted, the reset is when they leave the window (OpenAI's meaning), not 0.
    let reset = header(&second, "x-ratelimit-reset-tokens").unwrap_or_default();
    assert!(reset.ends_with('s') && !reset.ends_with("ms"), "{reset}");
    second.bytes().await.expect("body");
    // 24 >= 20 once the second is counted: refused while the window is full.
    eventually_async(
        Duration::from_secs(5),
        "the second reply's tokens were never counted",
        async || match chat(&g.main, TPM_KEY).await.status().as_u16() {
            429 => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
    let refused = chat(&g.main, TPM_KEY).await;
    assert!(header(&refused, "retry-after").is_some());
    let (status, e) = error_of(refused).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
}

#[tokio::test]
async fn max_concurrent_refuses_the_third_slow_stream_and_frees_slots_when_replies_end() {
    let g = start();
    let (path, body) = ("/v1/chat/completions", chat_body("echo-1", true));
    let headers = [("x-mock-chunks", "5"), ("x-mock-delay-ms", "200")];
    let a = send(&g.main, path, Some(CONC_KEY), &body, &headers).await;
    let b = send(&g.direct, path, Some(CONC_KEY), &body, &headers).await;
    // Each answer says the limit and the slots left (OpenAI's `x-ratelimit-*` style).
    assert_eq!(
        header(&a, "x-ratelimit-limit-concurrency").as_deref(),
        Some("2")
    );
    assert_eq!(
        header(&a, "x-ratelimit-remaining-concurrency").as_deref(),
        Some("1")
    );
    assert_eq!(
        header(&b, "x-ratelimit-remaining-concurrency").as_deref(),
        Some("0")
    );
    let refused = chat(&g.main, CONC_KEY).await;
    assert!(header(&refused, "retry-after").is_some());
    assert_eq!(
        header(&refused, "x-ratelimit-limit-concurrency").as_deref(),
        Some("2")
    );
    assert_eq!(
        header(&refused, "x-ratelimit-remaining-concurrency").as_deref(),
        Some("0")
    );
    let (status, e) = error_of(refused).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
    a.bytes().await.expect("a");
    b.bytes().await.expect("b");
    // The slots are freed as the requests end (the record is made right after).
    eventually_async(
        Duration::from_secs(5),
        "slots never freed",
        async || match chat(&g.main, CONC_KEY).await.status().as_u16() {
            200 => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
}

fn keys_with(dir: &Path, extra: &str) -> String {
    let now = std::fs::read_to_string(dir.join("keys.toml")).expect("keys");
    format!("{now}\n{extra}\n")
}

/// Waits (10 s at most) until more than `before` keys reloads were applied.
async fn await_reloads_past(g: &Gateway, before: f64) {
    eventually_async(Duration::from_secs(10), "no reload", async || {
        let n = metric_value(g, "modelgate_keys_reloads_total").await;
        if n <= before {
            Err(format!("{n} reloads"))
        } else {
            Ok(())
        }
    })
    .await;
}

/// Polls until `key` gets `status` on chat, for up to 2.5 s (the contract says 2 s).
async fn await_status(base: &str, key: &str, status: u16) {
    eventually_async(
        Duration::from_millis(2500),
        &format!("{key} did not get {status} within 2.5 s"),
        async || match chat(base, key).await.status().as_u16() {
            s if s == status => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
}

#[tokio::test]
async fn a_rewritten_keys_file_takes_effect_without_restart_and_a_stream_in_flight_finishes() {
    let g = start();
    let dir = g.dir.path().to_path_buf();
    // A slow stream, in flight across the reload, by a key the reload removes.
    let stream = send(
        &g.main,
        "/v1/chat/completions",
        Some(OTHER_KEY),
        &chat_body("echo-1", true),
        &[("x-mock-chunks", "10"), ("x-mock-delay-ms", "150")],
    )
    .await;
    let text = keys_with(
        &dir,
        "[[keys]]\nid = \"added\"\nsecret = \"sk-test-added-0100\"\n",
    )
    .replace(
        "[[keys]]\nid = \"other\"\nsecret = \"sk-test-other-tenant-0007\"\n",
        "",
    )
    .replace("models = [\"echo-*\"]", "models = [\"big-*\"]");
    // Write to a temp file and rename over it, as most tools do.
    std::fs::write(dir.join("keys.toml.tmp"), text).expect("write");
    std::fs::rename(dir.join("keys.toml.tmp"), dir.join("keys.toml")).expect("rename");
    await_status(&g.direct, "sk-test-added-0100", 200).await;
    await_status(&g.main, OTHER_KEY, 401).await;
    let (status, e) = error_of(chat(&g.main, ECHO_ONLY_KEY).await).await;
    assert_eq!(
        (status, e["param"].as_str()),
        (403, Some("model")),
        "the edited key's new model list"
    );
    let body = stream.text().await.expect("the stream in flight finished");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert_eq!(
        body.matches("\"content\"").count(),
        11,
        "role chunk + 10 tokens"
    );
}

#[tokio::test]
async fn a_kubernetes_style_symlink_swap_is_picked_up() {
    let g = start();
    let dir = g.dir.path().to_path_buf();
    // Recreate keys.toml as ..data/keys.toml behind a symlinked ..data folder.
    let v1 = dir.join("..v1");
    std::fs::create_dir(&v1).expect("mkdir");
    std::fs::copy(dir.join("keys.toml"), v1.join("keys.toml")).expect("copy");
    std::os::unix::fs::symlink("..v1", dir.join("..data")).expect("symlink");
    let reloads = metric_value(&g, "modelgate_keys_reloads_total").await;
    std::fs::remove_file(dir.join("keys.toml")).expect("rm");
    std::os::unix::fs::symlink("..data/keys.toml", dir.join("keys.toml")).expect("symlink");
    // The link is loaded before the swap, so the swap is a change of its own (no event names
    // the keys file then: the folder's new `..data` link is what wakes the reloader).
    await_reloads_past(&g, reloads).await;
    await_status(&g.main, KEY, 200).await;
    // The swap: a new folder, a new ..data link renamed over the old one.
    let v2 = dir.join("..v2");
    std::fs::create_dir(&v2).expect("mkdir");
    std::fs::write(
        v2.join("keys.toml"),
        keys_with(
            &v1,
            "[[keys]]\nid = \"swapped\"\nsecret = \"sk-test-swapped-0200\"\n",
        ),
    )
    .expect("write");
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).expect("symlink");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap");
    await_status(&g.direct, "sk-test-swapped-0200", 200).await;
}

#[tokio::test]
async fn a_broken_keys_file_is_rejected_whole_and_the_old_keys_stay_in_force() {
    let g = start();
    let dir = g.dir.path().to_path_buf();
    let broken = keys_with(
        &dir,
        "[[keys]]\nid = \"new\"\nsecret = \"sk-test-new-0300\"\nendpoints = [\"files\"]\n",
    );
    std::fs::write(dir.join("keys.toml"), broken).expect("write");
    // The rejection is counted in /metrics; wait for it rather than for time to pass.
    eventually_async(
        Duration::from_millis(2500),
        "no reload error counted",
        async || {
            let metrics = get(&g.admin, "/metrics", None)
                .await
                .text()
                .await
                .expect("text");
            if metrics.contains("modelgate_keys_reload_errors_total 1") {
                Ok(())
            } else {
                Err(format!("\n{metrics}"))
            }
        },
    )
    .await;
    assert_eq!(chat(&g.main, KEY).await.status(), 200, "old keys in force");
    assert_eq!(
        chat(&g.main, "sk-test-new-0300").await.status(),
        401,
        "nothing of the broken file applied"
    );
    let stderr = g.stop_and_stderr();
    assert!(
        stderr.contains("keys.toml") && stderr.contains("keys[") && stderr.contains("endpoints"),
        "{stderr}"
    );
}

#[tokio::test]
async fn sighup_reloads_and_does_not_stop_the_gateway() {
    let g = start();
    let pid = g.pid();
    std::fs::write(
        g.dir.path().join("keys.toml"),
        keys_with(
            g.dir.path(),
            "[[keys]]\nid = \"hup\"\nsecret = \"sk-test-hup-0400\"\n",
        ),
    )
    .expect("write");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    await_status(&g.main, "sk-test-hup-0400", 200).await;
    assert_eq!(
        chat(&g.direct, KEY).await.status(),
        200,
        "still serving after SIGHUP"
    );
}

#[tokio::test]
async fn limit_counters_of_a_key_that_survives_a_reload_are_kept() {
    let g = start();
    assert_eq!(chat(&g.main, RPM2_KEY).await.status(), 200);
    assert_eq!(chat(&g.main, RPM2_KEY).await.status(), 200);
    std::fs::write(
        g.dir.path().join("keys.toml"),
        keys_with(
            g.dir.path(),
            "[[keys]]\nid = \"later\"\nsecret = \"sk-test-later-0500\"\n",
        ),
    )
    .expect("write");
    await_status(&g.main, "sk-test-later-0500", 200).await;
    assert_eq!(
        chat(&g.direct, RPM2_KEY).await.status(),
        429,
        "the window survived the reload"
    );
}

/// An address throttled for wrong keys goes on using the key it used before (one client with a
/// wrong key must not lock out the others behind its NAT), also after a keys reload.
#[tokio::test]
async fn a_key_used_from_a_throttled_address_works_on_after_a_reload() {
    let g = start();
    assert_eq!(chat(&g.main, KEY).await.status(), 200);
    for i in 0..11 {
        let status = chat(&g.main, &format!("sk-test-wrong-{i:04}"))
            .await
            .status();
        assert!(status == 401 || status == 429, "{status}");
    }
    assert_eq!(chat(&g.main, OTHER_KEY).await.status(), 429, "throttled");
    assert_eq!(chat(&g.main, KEY).await.status(), 200);
    std::fs::write(
        g.dir.path().join("keys.toml"),
        keys_with(
            g.dir.path(),
            "[[keys]]\nid = \"after\"\nsecret = \"sk-test-after-0600\"\n",
        ),
    )
    .expect("write");
    await_reloads_past(&g, 0.0).await;
    assert_eq!(
        chat(&g.main, KEY).await.status(),
        200,
        "locked out by the reload"
    );
}

/// A concurrency limit a reload gives a key counts the requests the key already has running
/// (they were not counted while it had none). (With `on_client_gone = "cancel"`, so a stream
/// the client drops ends, and frees its slot, at once.)
#[tokio::test]
async fn a_concurrency_limit_added_by_a_reload_counts_the_requests_already_running() {
    let g = start_with(Setup {
        server_extra: "on_client_gone = \"cancel\"".into(),
        ..Setup::default()
    });
    let keys = g.dir.path().join("keys.toml");
    let entry = "[[keys]]\nid = \"grows\"\nsecret = \"sk-test-grows-0700\"\n";
    let before = std::fs::read_to_string(&keys).expect("keys");
    std::fs::write(&keys, format!("{before}\n{entry}")).expect("write");
    await_status(&g.main, "sk-test-grows-0700", 200).await;
    let mut running = Vec::new();
    for _ in 0..2 {
        let resp = client()
            .post(format!("{}/v1/chat/completions", g.main))
            .bearer_auth("sk-test-grows-0700")
            .header("x-mock-chunks", "100")
            .header("x-mock-delay-ms", "100")
            .json(&chat_body("echo-1", true))
            .send()
            .await
            .expect("stream");
        assert_eq!(resp.status(), 200);
        running.push(resp);
    }
    let reloads = metric_value(&g, "modelgate_keys_reloads_total").await;
    std::fs::write(&keys, format!("{before}\n{entry}max_concurrent = 2\n")).expect("write");
    await_reloads_past(&g, reloads).await;
    assert_eq!(chat(&g.main, "sk-test-grows-0700").await.status(), 429);
    drop(running);
    eventually_async(
        Duration::from_secs(10),
        "the slots were not freed",
        async || match chat(&g.main, "sk-test-grows-0700").await.status().as_u16() {
            200 => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
}

/// A 429 for rpm tells the key's concurrency headroom too (a client reads both from any reply).
#[tokio::test]
async fn an_rpm_refusal_tells_the_concurrency_headroom_too() {
    let g = start();
    let keys = g.dir.path().join("keys.toml");
    let before = std::fs::read_to_string(&keys).expect("keys");
    std::fs::write(
        &keys,
        format!("{before}\n[[keys]]\nid = \"both\"\nsecret = \"sk-test-both-0800\"\nrpm = 1\nmax_concurrent = 3\n"),
    )
    .expect("write");
    await_status(&g.main, "sk-test-both-0800", 200).await;
    let refused = chat(&g.main, "sk-test-both-0800").await;
    assert_eq!(refused.status(), 429);
    let h = |name: &str| {
        refused
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("").to_string())
    };
    assert_eq!(h("x-ratelimit-limit-requests").as_deref(), Some("1"));
    assert_eq!(h("x-ratelimit-limit-concurrency").as_deref(), Some("3"));
    assert_eq!(h("x-ratelimit-remaining-concurrency").as_deref(), Some("3"));
}
