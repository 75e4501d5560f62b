//! Shutdowns that lose nothing: SIGTERM lets requests finish within the grace period, ends the
//! rest with a record each, and exits as soon as nothing is in flight.
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

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
    // A kept-alive connection waiting for its next request (keep-alive 60 s) is not a request
    // in flight: it does not hold the exit back.
    let mut idle = blocking_connect(&g.main, Duration::from_secs(20));
    let first = models_over(&mut idle);
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let started = Instant::now();
    let status = tokio::task::block_in_place(|| g.terminate());
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// With `shutdown_delay_ms`, SIGTERM drains first: `/readyz` answers 503 `draining` while the
/// API still serves, each reply closing its connection (a kept-alive one too), so a load
/// balancer moves the clients elsewhere; the listeners close after the delay and the process
/// exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_delay_drains_before_the_listeners_close() {
    let mut g = start_with(Setup {
        server_extra: "shutdown_delay_ms = 4000".into(),
        ..Setup::default()
    });
    assert_eq!(get(&g.admin, "/readyz", None).await.status(), 200);
    let mut kept = blocking_connect(&g.main, Duration::from_secs(20));
    let first = models_over(&mut kept);
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        !first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );
    let started = Instant::now();
    g.send_signal("-TERM");
    let readiness = eventually_async(Duration::from_secs(2), "/readyz never 503", async || {
        let r = get(&g.admin, "/readyz", None).await;
        if r.status() == 503 {
            Ok(r.json::<serde_json::Value>().await.expect("json"))
        } else {
            Err(format!("/readyz still {}", r.status()))
        }
    })
    .await;
    assert_eq!(readiness["status"], "draining", "{readiness}");
    assert_eq!(get(&g.admin, "/healthz", None).await.status(), 200);
    // Served while draining, and the connection closed after the reply: the kept-alive one and
    // a new one alike.
    let again = models_over(&mut kept);
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    assert!(
        again.to_ascii_lowercase().contains("connection: close"),
        "{again}"
    );
    let mut rest = [0u8; 64];
    let n = std::io::Read::read(&mut kept, &mut rest).expect("read");
    assert_eq!(n, 0, "still open: {}", String::from_utf8_lossy(&rest[..n]));
    let resp = get(&g.main, "/v1/models", Some(KEY)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["connection"], "close");
    let status = tokio::task::block_in_place(|| g.wait());
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "the listeners closed before the delay: {:?}",
        started.elapsed()
    );
}

/// A long shutdown delay is no trap: another SIGTERM ends it, as does a Ctrl-C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_or_a_ctrl_c_ends_the_shutdown_delay() {
    for second in ["-TERM", "-INT"] {
        let mut g = start_with(Setup {
            server_extra: "shutdown_delay_ms = 600000".into(),
            ..Setup::default()
        });
        g.send_signal("-TERM");
        eventually_async(
            Duration::from_secs(10),
            "never draining",
            async || match get(&g.admin, "/readyz", None).await.status().as_u16() {
                503 => Ok(()),
                s => Err(format!("/readyz {s}")),
            },
        )
        .await;
        let started = Instant::now();
        let status = tokio::task::block_in_place(|| g.signal(second));
        assert!(status.success(), "{second}: {status}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{second}: {:?}",
            started.elapsed()
        );
    }
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
        let resp = long_stream(&c, &g.direct).await;
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
    let page = usage_page(&g, "limit=100").await;
    let records = page["data"].as_array().expect("data");
    assert_eq!(records.len(), n, "{page}");
    for r in records {
        assert_eq!(r["status"], 503, "{r}");
        assert_eq!(r["cut"], "shutdown", "{r}");
        assert!(
            r["completion_tokens"].as_u64() > Some(0),
            "tokens so far: {r}"
        );
        assert_eq!(r["stream"], json!(true));
    }
}

/// Ctrl-C shuts down as SIGTERM does (Pingora's own handling stopped at once and lost the
/// records in flight); a second Ctrl-C ends the grace period (a minute here) at once, and the
/// streams in flight are cut, each with its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_shuts_down_with_every_record_and_a_second_one_ends_the_wait() {
    ctrl_c_ends_the_wait_after("-INT").await;
}

/// A Ctrl-C after a SIGTERM ends the grace period at once as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ctrl_c_after_sigterm_ends_the_wait() {
    ctrl_c_ends_the_wait_after("-TERM").await;
}

/// `first` begins a shutdown with a minute's grace while three streams run; a Ctrl-C then
/// ends them at once, each with its record (503).
async fn ctrl_c_ends_the_wait_after(first: &str) {
    let mut g = start_with(Setup {
        grace_seconds: 60,
        ..Setup::default()
    });
    let c = client();
    let mut ids = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let resp = long_stream(&c, &g.main).await;
        ids.push(request_id(&resp));
        streams.push(tokio::spawn(async move {
            let mut resp = resp;
            while let Ok(Some(_)) = resp.chunk().await {}
        }));
    }
    g.send_signal(first);
    // The first one is taken once the listener stops accepting; the streams go on meanwhile.
    let addr = g.main.trim_start_matches("http://").to_string();
    eventually_async(
        Duration::from_secs(10),
        &format!("still accepting after {first}"),
        async || match std::net::TcpStream::connect(&addr) {
            Ok(_) => Err(String::new()),
            Err(_) => Ok(()),
        },
    )
    .await;
    assert!(g.running(), "exited at once");
    let started = Instant::now();
    g.send_signal("-INT");
    let status = tokio::task::block_in_place(|| g.wait());
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    for s in streams {
        s.await.expect("stream task");
    }
    let g = g.restart_stopped();
    let page = usage_page(&g, "limit=100").await;
    let mut got: Vec<(String, u64)> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|r| {
            (
                r["request_id"].as_str().unwrap_or_default().to_string(),
                r["status"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    got.sort();
    ids.sort();
    let want: Vec<(String, u64)> = ids.into_iter().map(|id| (id, 503)).collect();
    assert_eq!(got, want, "{page}");
}

/// Requests that hold the shutdown on the client's side: an upload that stalls half way, and
/// a stream whose client stops reading (the gateway's write to it waits). The shutdown ends
/// them too after the grace period, each with its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_and_a_client_that_stops_reading_are_cut_with_a_record_each() {
    use std::io::{Read, Write};
    let mut g = start_with(Setup {
        grace_seconds: 1,
        ..Setup::default()
    });
    // The upload: its 100 Continue says its body is being read; 10 of 140 bytes come.
    let mut upload = blocking_connect(&g.main, Duration::from_secs(20));
    let head = chat_head(KEY, 140, "Expect: 100-continue\r\n");
    upload.write_all(head.as_bytes()).expect("head");
    let mut buf = [0u8; 4096];
    let n = upload.read(&mut buf).expect("100");
    assert!(buf[..n].starts_with(b"HTTP/1.1 100"), "{:?}", &buf[..n]);
    upload.write_all(b"{\"model\":").expect("part of the body");
    // The stream: a long fast one, read up to its header and then no more.
    let body = serde_json::to_string(&chat_body("echo-1", true)).expect("json");
    let head = chat_head(KEY, body.len(), "x-mock-chunks: 100000\r\n");
    let (_reader, stream_id) = stop_reading_after_the_header(&g.direct, &(head + &body));

    terminate_past_the_grace_period(&mut g);
    let mut answer = Vec::new();
    let _ = upload.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("shutting_down"), "{answer}");
    let upload_id = request_id_in(&answer);

    let g = g.restart_stopped();
    let page = usage_page(&g, "limit=100").await;
    let mut records: Vec<(String, u64, bool)> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|r| {
            (
                r["request_id"].as_str().unwrap_or_default().to_string(),
                r["status"].as_u64().unwrap_or_default(),
                r["stream"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    records.sort();
    let mut want = vec![(upload_id, 503, false), (stream_id, 503, true)];
    want.sort();
    assert_eq!(records, want, "{page}");
}

/// An upstream that sends its error header and then stalls on the body: the gateway reads the
/// body before it answers, so no reply has begun when the shutdown's cut comes. The client is
/// told `shutting_down` (503), as while the gateway waits for a header, and its record says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_reply_whose_body_stalls_is_answered_503_when_the_shutdown_cuts_it() {
    use std::io::{Read, Write};
    let mut g = start_with(Setup {
        grace_seconds: 1,
        ..Setup::default()
    });
    let body = serde_json::to_string(&chat_body("echo-1", false)).expect("json");
    let head = chat_head(
        KEY,
        body.len(),
        "x-mock-status: 400\r\nx-mock-body-delay-ms: 30000\r\n",
    );
    let mut client = blocking_connect(&g.main, Duration::from_secs(20));
    client
        .write_all((head + &body).as_bytes())
        .expect("request");
    // The try is counted by its outcome once the upstream's header is in: its body stalls.
    eventually_async(
        Duration::from_secs(5),
        "the upstream's header did not come",
        async || {
            let counted = metrics_text(&g).await.lines().any(|l| {
                l.starts_with("modelgate_upstream_attempts_total")
                    && l.contains("outcome=\"4xx\"")
                    && l.trim_end().ends_with(" 1")
            });
            if counted { Ok(()) } else { Err(String::new()) }
        },
    )
    .await;
    terminate_past_the_grace_period(&mut g);
    let mut answer = Vec::new();
    let _ = client.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("shutting_down"), "{answer}");
    let id = request_id_in(&answer);
    let g = g.restart_stopped();
    let page = usage_page(&g, "limit=100").await;
    let records: Vec<(&str, u64)> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|r| {
            (
                r["request_id"].as_str().unwrap_or_default(),
                r["status"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(records, [(id.as_str(), 503)], "{page}");
}

/// A CSV export to a client that stops reading: the shutdown ends it too, with its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_export_to_a_client_that_stops_reading_is_cut_with_its_record() {
    let mut g = start_with(Setup {
        grace_seconds: 1,
        ..Setup::default()
    });
    // 60,000 records of the key: a CSV of about 8 MB, more than the sockets between hold.
    seed_records(&g, 60_000, 0);
    let req =
        format!("GET /api/usage.csv HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    let (_reader, id) = stop_reading_after_the_header(&g.direct, &req);

    terminate_past_the_grace_period(&mut g);
    let g = g.restart_stopped();
    let page = usage_page(&g, "limit=1&order=desc").await;
    let r = &page["data"][0];
    assert_eq!(
        (
            r["request_id"].as_str(),
            r["endpoint"].as_str(),
            r["status"].as_u64()
        ),
        (Some(id.as_str()), Some("usage"), Some(503)),
        "{page}"
    );
}

/// A reply the gateway makes itself (a usage page, here of 10,000 records, sent twice on one
/// connection) to a client that stops reading: the shutdown ends it too, with its record, and
/// the exit does not wait for the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_page_to_a_client_that_stops_reading_is_cut_with_its_record() {
    let mut g = start_with(Setup {
        grace_seconds: 1,
        ..Setup::default()
    });
    seed_records(&g, 10_000, 60_000);
    // About 4.5 MB each: together more than the sockets between hold.
    let one = format!(
        "GET /api/usage?limit=10000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n"
    );
    let (_reader, first) = stop_reading_after_the_header(&g.direct, &one.repeat(2));

    terminate_past_the_grace_period(&mut g);
    let g = g.restart_stopped();
    let page = usage_page(&g, "limit=3&order=desc").await;
    // The first page was cut, or it went whole and the second (its own id) was cut, or the
    // second was never read (a connection takes no new request once the shutdown began: it
    // passed no auth and leaves no record).
    let cut: Vec<_> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter(|r| r["endpoint"] == "usage")
        .map(|r| {
            (
                r["request_id"].as_str() == Some(&first),
                r["status"].as_u64(),
            )
        })
        .collect();
    assert!(
        cut == [(true, Some(503))]
            || cut == [(false, Some(503)), (true, Some(200))]
            || cut == [(true, Some(200))],
        "{page}"
    );
}

/// The test key's usage page of the (restarted) gateway, for `query`.
async fn usage_page(g: &Gateway, query: &str) -> serde_json::Value {
    get(&g.direct, &format!("/api/usage?{query}"), Some(KEY))
        .await
        .json()
        .await
        .expect("json")
}

/// A stream of 100 events 200 ms apart (20 s, far past any grace period here), started.
async fn long_stream(c: &reqwest::Client, base: &str) -> reqwest::Response {
    let resp = c
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-mock-chunks", "100")
        .header("x-mock-delay-ms", "200")
        .json(&chat_body("echo-1", true))
        .send()
        .await
        .expect("stream starts");
    assert_eq!(resp.status(), 200);
    resp
}

/// SIGTERM with a grace period of 1 s: the exit comes right after it (the cut requests end at
/// once), not after the wait for requests that ignore the cut.
fn terminate_past_the_grace_period(g: &mut Gateway) {
    let started = Instant::now();
    let status = tokio::task::block_in_place(|| g.terminate());
    let took = started.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_millis(2_500), "{took:?}");
}

/// Kills the process when dropped (the new instance of an upgrade).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_under_load_refuses_nothing_and_finishes_the_stream_in_flight() {
    let mut old = start_with(Setup {
        grace_seconds: 30,
        ..Setup::default()
    });
    // A stream of about 8 s that starts before the hand-over and must end cleanly.
    let stream = client()
        .post(format!("{}/v1/chat/completions", old.main))
        .bearer_auth(KEY)
        .header("x-mock-chunks", "40")
        .header("x-mock-delay-ms", "200")
        .json(&chat_body("echo-1", true))
        .send()
        .await
        .expect("stream starts");
    let stream = tokio::spawn(async move {
        let mut resp = stream;
        let mut body = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(b)) => body.extend_from_slice(&b),
                Ok(None) => return (String::from_utf8_lossy(&body).into_owned(), true),
                Err(_) => return (String::from_utf8_lossy(&body).into_owned(), false),
            }
        }
    });
    // A client hammering the gateway meanwhile, one new connection a request.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = {
        let (stop, base) = (stop.clone(), old.direct.clone());
        tokio::spawn(async move {
            let c = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("client");
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c
                    .post(format!("{base}/v1/chat/completions"))
                    .bearer_auth(KEY)
                    .json(&chat_body("echo-1", false))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => ok += 1,
                    Ok(r) => failed.push(r.status().to_string()),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed)
        })
    };
    // The new instance takes the listeners over by their addresses: the ports picked.
    old.pin_ports();
    let config = old.dir.path().join("modelgate.toml");
    let sock = old.dir.path().join("modelgate-upgrade.sock");
    let new = Killed(
        std::process::Command::new(bin())
            .args(["serve", "-u", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn the new instance"),
    );
    // The new instance waits for the sockets on the upgrade socket; then the old one hands
    // them over on SIGQUIT.
    eventually_async(
        Duration::from_secs(30),
        "the new instance never listened for the hand-over",
        async || {
            if sock.exists() {
                Ok(())
            } else {
                Err(String::new())
            }
        },
    )
    .await;
    let status = tokio::task::block_in_place(|| old.signal("-QUIT"));
    assert!(status.success(), "old instance: {status}");
    let (body, clean) = stream.await.expect("stream task");
    assert!(
        clean && body.contains("data: [DONE]"),
        "stream cut across the upgrade: {body}"
    );
    // The new instance alone now; a few more requests, then stop the hammer.
    for _ in 0..5 {
        assert_eq!(chat_status_on(&old.main).await, 200);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = hammer.await.expect("hammer");
    assert!(
        failed.is_empty(),
        "{} failed of {}: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );
    assert!(ok > 20, "only {ok} requests during the upgrade");
    drop(new);
}

async fn chat_status_on(base: &str) -> u16 {
    post_json(base, "/v1/chat/completions", &chat_body("echo-1", false))
        .await
        .status()
        .as_u16()
}
