//! The edge, attacked: wrong keys at volume (throttled, and no timing difference between an
//! unknown key and a near miss), header injection through model names and query strings, path
//! traversal and odd encodings on the page and console routes, request smuggling (CL+TE,
//! duplicate or malformed lengths) that must never reach the upstream as two requests, and the
//! client's key and the upstream credential absent from everything the gateway emits. Slow
//! headers and bodies are in `client_timeouts.rs`.
//!
//! The upstream here is a byte recorder (`Recorder`): it keeps every request exactly as it
//! arrived on the wire and answers a fixed chat completion, so a test can count and read what
//! the gateway really sent.
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

mod common;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const REPLY: &str = r#"{"id":"chatcmpl-rec","object":"chat.completion","created":0,"model":"echo-1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;

/// One request as the upstream received it: the header bytes and the body.
#[derive(Clone, Debug)]
struct Seen {
    head: String,
    body: Vec<u8>,
}

/// An HTTP/1.1 upstream that records every request's bytes. It frames requests by
/// Content-Length only: a request framed any other way is recorded with what follows it and
/// shows up as a failure in the tests.
struct Recorder {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Every byte received, across connections.
    wire: Arc<Mutex<Vec<u8>>>,
    /// A whole reply (status line, header, body) to answer with instead of `REPLY`; the
    /// connection is closed after it.
    raw_reply: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let wire: Arc<Mutex<Vec<u8>>> = Arc::default();
        let raw_reply: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
        let (s, w, b) = (seen.clone(), wire.clone(), raw_reply.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(Self::serve(conn, s.clone(), w.clone(), b.clone()));
            }
        });
        Recorder {
            port,
            seen,
            wire,
            raw_reply,
        }
    }

    async fn serve(
        mut conn: tokio::net::TcpStream,
        seen: Arc<Mutex<Vec<Seen>>>,
        wire: Arc<Mutex<Vec<u8>>>,
        answer: Arc<Mutex<Option<Vec<u8>>>>,
    ) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16384];
        loop {
            // A whole header, then Content-Length bytes of body.
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        wire.lock().expect("lock").extend_from_slice(&chunk[..n]);
                        buf.extend_from_slice(&chunk[..n]);
                    }
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            while buf.len() < head_end + length {
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        wire.lock().expect("lock").extend_from_slice(&chunk[..n]);
                        buf.extend_from_slice(&chunk[..n]);
                    }
                }
            }
            let body = buf[head_end..head_end + length].to_vec();
            buf.drain(..head_end + length);
            seen.lock().expect("lock").push(Seen { head, body });
            let custom = answer.lock().expect("lock").clone();
            if let Some(raw) = custom {
                let _ = conn.write_all(&raw).await;
                return;
            }
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 x-ratelimit-limit-requests: 10000\r\nx-ratelimit-remaining-requests: 9999\r\n\r\n{REPLY}",
                REPLY.len()
            );
            let reply = reply.into_bytes();
            if conn.write_all(&reply).await.is_err() {
                return;
            }
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    fn wire(&self) -> Vec<u8> {
        self.wire.lock().expect("lock").clone()
    }

    /// `[[pools]]` and `[[models]]` routing model `recorded` here. The pool passes `x-kept`
    /// and `x-secret-hop` on: a header named to pass still stays on its hop when the
    /// upstream's `Connection` names it.
    fn config(&self) -> String {
        format!(
            "\n[[pools]]\nname = \"recorded\"\nupstreams = [\"http://127.0.0.1:{}\"]\n\
             api_key = \"{POOL_KEY}\"\nhealth_interval_ms = 0\n\
             pass_headers = [\"x-kept\", \"x-secret-hop\"]\n\n\
             [[models]]\nname = \"recorded\"\npool = \"recorded\"\nupstream_model = \"echo-1\"\n",
            self.port
        )
    }
}

fn addr(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

/// Sends raw bytes on a new connection and reads until the gateway closes it (or 5 s pass).
fn raw(base: &str, bytes: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr(base)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status codes of every response in a raw exchange, in order.
fn statuses(raw: &str) -> Vec<u16> {
    raw.match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| raw.get(i + 9..i + 12)?.parse().ok())
        .collect()
}

// ---------------------------------------------------------------------------------------
// Wrong keys
// ---------------------------------------------------------------------------------------

/// Behind a trusted proxy (`[server] trusted_proxies`, here the loopback the test connects
/// from), the throttle counts each client by the address the proxy names in
/// `X-Forwarded-For`: one client's wrong keys do not lock out the others behind the same proxy.
/// From a peer that is not trusted, the header is not believed.
#[tokio::test]
async fn behind_a_trusted_proxy_wrong_keys_are_counted_per_forwarded_client() {
    let chat = |base: String, key: &'static str, xff: &'static str| async move {
        send(
            &base,
            "/v1/chat/completions",
            Some(key),
            &chat_body("echo-1", false),
            &[("x-forwarded-for", xff)],
        )
        .await
        .status()
        .as_u16()
    };
    let g = start_with(Setup {
        server_extra: "trusted_proxies = [\"127.0.0.0/8\", \"::1\"]".into(),
        ..Setup::default()
    });
    for _ in 0..11 {
        let s = chat(g.main.clone(), "sk-wrong-key-0000000", "203.0.113.7").await;
        assert!(s == 401 || s == 429, "{s}");
    }
    assert_eq!(
        chat(g.main.clone(), KEY, "203.0.113.7").await,
        429,
        "that client"
    );
    // A forged entry on the left is not believed: the proxy's own entry is the client.
    assert_eq!(
        chat(g.main.clone(), KEY, "198.51.100.1, 203.0.113.7").await,
        429
    );
    assert_eq!(
        chat(g.main.clone(), KEY, "203.0.113.8").await,
        200,
        "another client"
    );

    // Not trusted: the header is the client's to write, and the peer is counted.
    let g = start();
    for i in 0..11 {
        let xff = ["203.0.113.1", "203.0.113.2", "203.0.113.3"][i % 3];
        let s = chat(g.main.clone(), "sk-wrong-key-0000000", xff).await;
        assert!(s == 401 || s == 429, "{s}");
    }
    assert_eq!(chat(g.main.clone(), OTHER_KEY, "203.0.113.9").await, 429);
}

/// A path read without its trailing slash goes up as the API names it (a server that
/// redirects `/v1/chat/completions/` would send the client its own address), its query kept.
#[tokio::test]
async fn a_trailing_slash_goes_upstream_as_the_api_names_the_path() {
    let rec = Recorder::start().await;
    let g = start_with(Setup {
        extra_config: rec.config(),
        ..Setup::default()
    });
    let body = chat_body("recorded", false);
    let resp = send(&g.main, "/v1/chat/completions/?x=1", Some(KEY), &body, &[]).await;
    assert_eq!(resp.status(), 200);
    let seen = rec.seen();
    let head = &seen.last().expect("one request").head;
    assert!(
        head.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\n"),
        "{head}"
    );
}

/// A reply body that reads like the header of Pingora's own bare error goes to the client as
/// it came: the listener replaces that error only before the proxy has a request's header
/// (the body was swapped mid-reply for a 400 of the gateway's, and the connection's framing
/// broken for the next reply).
#[tokio::test]
async fn a_reply_body_that_reads_like_an_http_header_passes_unchanged() {
    let rec = Recorder::start().await;
    let poison =
        b"HTTP/1.1 404 X\r\ncache-control: private, no-store\r\ncontent-length: 0\r\n\r\n".to_vec();
    let mut raw = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
        poison.len()
    )
    .into_bytes();
    raw.extend_from_slice(&poison);
    *rec.raw_reply.lock().expect("lock") = Some(raw);
    let g = start_with(Setup {
        extra_config: rec.config(),
        ..Setup::default()
    });
    let c = client();
    for _ in 0..2 {
        let resp = c
            .post(format!("{}/v1/chat/completions", g.main))
            .bearer_auth(KEY)
            .json(&chat_body("recorded", false))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), 200);
        assert_eq!(&resp.bytes().await.expect("body")[..], &poison[..]);
    }
}

/// The upstream's hop-by-hop reply headers stay on its hop (RFC 9110 §7.6.1): those its
/// `Connection` names, `Keep-Alive`, `Upgrade`, `Proxy-Authenticate`, `Trailer`, its framing;
/// and an HTTP/1.0 upstream's reply (ended by its close) reaches an HTTP/1.1 client as an
/// HTTP/1.1 reply in chunks, whole.
#[tokio::test]
async fn the_upstreams_hop_by_hop_reply_headers_and_version_stay_on_its_hop() {
    let rec = Recorder::start().await;
    let raw = format!(
        "HTTP/1.0 200 OK\r\ncontent-type: application/json\r\nConnection: x-secret-hop, keep-alive\r\n\
         X-Secret-Hop: leak\r\nKeep-Alive: timeout=5\r\nUpgrade: h2c\r\nProxy-Authenticate: Basic\r\n\
         Trailer: x-t\r\nx-kept: yes\r\n\r\n{REPLY}"
    );
    *rec.raw_reply.lock().expect("lock") = Some(raw.into_bytes());
    let g = start_with(Setup {
        extra_config: rec.config(),
        ..Setup::default()
    });
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("recorded", false),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), reqwest::Version::HTTP_11);
    let h = resp.headers().clone();
    for gone in [
        "x-secret-hop",
        "keep-alive",
        "upgrade",
        "proxy-authenticate",
        "trailer",
    ] {
        assert!(!h.contains_key(gone), "{gone}: {h:?}");
    }
    assert_eq!(h["x-kept"], "yes");
    assert_eq!(h["transfer-encoding"], "chunked", "{h:?}");
    let id = h["x-request-id"].to_str().expect("id").to_string();
    assert_eq!(resp.text().await.expect("body"), REPLY);
    let r = await_record(&g, &id).await;
    assert_eq!(
        (r["status"].as_u64(), r["total_tokens"].as_u64()),
        (Some(200), Some(4)),
        "{r}"
    );
}

/// An HTTP/1.0 client knows no chunks: a stream (chunked from the upstream) reaches it ended
/// by the close of the connection, its events whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_client_gets_a_stream_without_chunks() {
    let g = start();
    let body = serde_json::to_string(&chat_body("echo-1", true)).expect("json");
    let request = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let reply = raw(&g.main, request.as_bytes());
    let (head, events) = reply.split_once("\r\n\r\n").expect("a header");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    assert!(events.starts_with("data: {"), "{events}");
    assert!(events.ends_with("data: [DONE]\n\n"), "{events}");
}

/// An absolute-form target (`POST http://evil.example/v1/...`, which RFC 9112 lets a
/// client send) goes upstream in origin-form: a front end before the upstream (a forward or
/// egress proxy, a server of several hosts) would route by the target's host, and take the
/// pool's credential there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_form_target_goes_upstream_in_origin_form() {
    let rec = Recorder::start().await;
    let g = start_with(Setup {
        extra_config: rec.config(),
        ..Setup::default()
    });
    let body = serde_json::to_string(&chat_body("recorded", false)).expect("json");
    for (n, target) in [
        "http://evil.example/v1/chat/completions",
        "ftp://evil.example/v1/chat/completions?x=1",
        "HTTP://evil.example/v1/chat/completions/",
    ]
    .into_iter()
    .enumerate()
    {
        let request = format!(
            "POST {target} HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer {KEY}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let reply = raw(&g.main, request.as_bytes());
        assert!(reply.starts_with("HTTP/1.1 200"), "{target}: {reply}");
        let seen = rec.seen();
        assert_eq!(seen.len(), n + 1, "{target}");
        let head = &seen[n].head;
        let line = head.lines().next().unwrap_or_default();
        assert!(
            line.starts_with("POST /v1/chat/completions"),
            "{target}: {line}"
        );
        assert!(!head.contains("evil.example"), "{target}: {head}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_wrong_keys_are_throttled_and_never_reach_the_upstream() {
    let rec = Recorder::start().await;
    let g = start_with(Setup {
        extra_config: rec.config(),
        ..Setup::default()
    });
    // Keep-alive connections from 127.0.0.1, 50 at a time; unknown keys and near misses of a
    // real key (its last character changed) alternate.
    let attacker = client();
    let url = format!("{}/v1/chat/completions", g.direct);
    let body = chat_body("recorded", false);
    let near_miss = format!("{}X", &KEY[..KEY.len() - 1]);
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..50 {
        let (c, url, body, near_miss) = (
            attacker.clone(),
            url.clone(),
            body.clone(),
            near_miss.clone(),
        );
        tasks.spawn(async move {
            let mut counts = std::collections::BTreeMap::<u16, usize>::new();
            for i in 0..200 {
                let key = if i % 2 == 0 {
                    format!("sk-guess-{t}-{i}")
                } else {
                    near_miss.clone()
                };
                let resp = c
                    .post(&url)
                    .bearer_auth(&key)
                    .json(&body)
                    .send()
                    .await
                    .expect("send");
                let status = resp.status().as_u16();
                if status == 429 {
                    assert!(resp.headers().contains_key("retry-after"));
                }
                let text = resp.text().await.expect("body");
                assert!(!text.contains(&key), "the key echoed: {text}");
                *counts.entry(status).or_default() += 1;
            }
            counts
        });
    }
    let mut counts = std::collections::BTreeMap::<u16, usize>::new();
    while let Some(c) = tasks.join_next().await {
        for (s, n) in c.expect("task") {
            *counts.entry(s).or_default() += n;
        }
    }
    // The default allowance is 10 wrong keys a minute per address: then 429, for any key that
    // address has not used (a right guess looks like a wrong one).
    assert_eq!(
        counts,
        [(401, 10), (429, 9_990)].into_iter().collect(),
        "{counts:?}"
    );
    assert!(rec.seen().is_empty(), "a wrong key reached the upstream");
    let throttled = send(&g.direct, "/v1/chat/completions", Some(KEY), &body, &[]).await;
    assert_eq!(
        throttled.status(),
        429,
        "the address is throttled for a key it has not used"
    );

    // Another address is not: the right key from 127.0.0.2 is served.
    let from = |last: u8| {
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::from([127, 0, 0, last]))
            .build()
            .expect("client")
    };
    let call = |c: reqwest::Client, key: String| {
        let (url, body) = (url.clone(), body.clone());
        async move {
            let resp = c.post(&url).bearer_auth(key).json(&body).send().await;
            resp.expect("send").status().as_u16()
        }
    };
    assert_eq!(call(from(2), KEY.into()).await, 200);
    assert_eq!(rec.seen().len(), 1);

    // Behind one address (a NAT), one client's wrong key does not lock out the others: a key
    // used from there before goes on working; a key new to it, and more wrong ones, get 429.
    assert_eq!(call(from(3), KEY.into()).await, 200);
    for i in 0..10 {
        assert_eq!(call(from(3), format!("sk-misconfigured-{i}")).await, 401);
    }
    assert_eq!(call(from(3), "sk-misconfigured".into()).await, 429);
    assert_eq!(call(from(3), OTHER_KEY.into()).await, 429);
    assert_eq!(call(from(3), KEY.into()).await, 200);
    assert_eq!(rec.seen().len(), 3);
    // Wrong keys count on while throttled: at three times the limit nothing passes, so no
    // one behind the address can guess on at speed (a right guess would pass).
    // (11 counted so far: 10 answered 401, one 429.)
    for i in 0..19 {
        assert_eq!(call(from(3), format!("sk-guess-more-{i}")).await, 429);
    }
    assert_eq!(call(from(3), KEY.into()).await, 429);
    assert_eq!(rec.seen().len(), 3);
}

/// The median of the differences of paired timings, in microseconds.
fn median_difference(a: &[f64], b: &[f64]) -> f64 {
    let mut d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    d.sort_by(f64::total_cmp);
    d[d.len() / 2]
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_and_a_near_miss_of_a_real_key_take_the_same_time() {
    let g = start_with(Setup {
        limits_extra: "auth_failures_per_minute = 0".into(),
        ..Setup::default()
    });
    let c = client();
    let url = format!("{}/v1/models", g.main);
    let near_miss = format!("{}X", &KEY[..KEY.len() - 1]);
    let time = |key: String| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let t = Instant::now();
            let resp = c.get(&url).bearer_auth(key).send().await.expect("send");
            assert_eq!(resp.status(), 401);
            let _ = resp.bytes().await;
            t.elapsed().as_secs_f64() * 1e6
        }
    };
    // Warm the connection, then pairs in alternating order so drift hits both alike.
    for _ in 0..200 {
        time("sk-warm".into()).await;
    }
    let (mut unknown, mut near) = (Vec::new(), Vec::new());
    for i in 0..2_000 {
        let u = format!(
            "sk-unknown-{i:012}-{}",
            "z".repeat(KEY.len().saturating_sub(24))
        );
        if i % 2 == 0 {
            unknown.push(time(u).await);
            near.push(time(near_miss.clone()).await);
        } else {
            near.push(time(near_miss.clone()).await);
            unknown.push(time(u).await);
        }
    }
    let (mu, mn) = (median(&unknown), median(&near));
    let diff = median_difference(&unknown, &near).abs();
    // A key compared byte by byte would show in a difference proportional to the matched
    // prefix; a lookup by SHA-256 shows none. Loopback noise is tens of microseconds.
    assert!(
        diff < 0.1 * mu.min(mn) + 15.0,
        "unknown {mu:.1} µs, near miss {mn:.1} µs, paired difference {diff:.1} µs"
    );
}

// ---------------------------------------------------------------------------------------
// Injection
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn header_injection_through_model_names_and_query_strings_goes_nowhere() {
    let rec = Recorder::start().await;
    let g = start_with(Setup {
        extra_config: rec.config(),
        ..Setup::default()
    });
    for base in g.bases() {
        for model in [
            "echo-1\r\nX-Injected: 1",
            "recorded\r\nX-Injected: 1",
            "recorded\nX-Injected: 1",
            "x\r\n\r\nHTTP/1.1 200 OK\r\nX-Injected: 1",
            "recorded\u{0}X-Injected: 1",
        ] {
            let resp = post_json(
                &base,
                "/v1/chat/completions",
                &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
            assert!(
                !resp.headers().keys().any(|k| k.as_str() == "x-injected"),
                "{model:?}"
            );
            let (status, e) = error_of(resp).await;
            assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")));
            assert_eq!(e["param"], "model");
        }
        // Query strings with encoded CR LF on the usage API and its CSV.
        for path in [
            "/api/usage?model=x%0d%0aX-Injected:%201",
            "/api/usage.csv?model=x%0d%0aX-Injected:%201&from=2026-01-01",
            "/api/usage?cursor=%0d%0aX-Injected:%201",
            "/api/usage.csv?from=2026%0d%0aX-Injected:%201",
            "/v1/models?x=%0d%0aX-Injected:%201",
        ] {
            let resp = get(&base, path, Some(KEY)).await;
            assert!(
                !resp.headers().keys().any(|k| k.as_str() == "x-injected"),
                "{path}"
            );
            for v in resp.headers().values() {
                let v = v.as_bytes();
                assert!(!v.contains(&b'\r') && !v.contains(&b'\n'), "{path}");
            }
        }
    }
    // The upstream got none of it.
    let wire = String::from_utf8_lossy(&rec.wire()).to_ascii_lowercase();
    assert!(!wire.contains("x-injected"), "{wire}");
}

// ---------------------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_traversal_and_odd_encodings_on_the_page_and_console_routes_find_nothing() {
    let g = start_with(Setup {
        extra_config: "\n[console]\nuser = \"admin\"\npassword = \"env:MG_SEC_PW\"\n".into(),
        env: vec![("MG_SEC_PW".into(), "a console password".into())],
        ..Setup::default()
    });
    let targets = [
        "/../../../../etc/passwd",
        "/assets/../../../../etc/passwd",
        "/assets/..%2f..%2f..%2f..%2fetc%2fpasswd",
        "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/%252e%252e/%252e%252e/etc/passwd",
        "/assets/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd",
        "/assets/..\\..\\..\\etc\\passwd",
        "//etc/passwd",
        "/console/../../../../etc/passwd",
        "/console/..%2f..%2f..%2fCargo.toml",
        "/console/%2e%2e/%2e%2e/Cargo.toml",
        "/console/api/../../../../etc/passwd",
        "/console/app.js%00.html",
        "/app.js%00",
        "/api/usage/../../../etc/passwd",
        "/%ff%fe/..%u2216..%u2216etc/passwd",
    ];
    let mut all = 0;
    for base in g.bases() {
        for target in targets {
            let reply = tokio::task::block_in_place(|| {
                raw(
                    &base,
                    format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
            });
            let status = statuses(&reply).first().copied().unwrap_or(0);
            assert!(
                matches!(status, 400 | 401 | 404),
                "{base}{target}: {status}\n{reply}"
            );
            assert!(
                !reply.contains("root:") && !reply.contains("[package]"),
                "{base}{target} leaked a file:\n{reply}"
            );
            if status != 401 {
                // The contract's JSON error, never a page or a file.
                let body = reply.split("\r\n\r\n").nth(1).unwrap_or("");
                let v: Value = serde_json::from_str(body)
                    .unwrap_or_else(|e| panic!("{base}{target}: {e}: {reply}"));
                assert!(v["error"]["code"].is_string(), "{reply}");
            }
            all += 1;
        }
    }
    assert_eq!(all, 2 * targets.len());
}

// ---------------------------------------------------------------------------------------
// Smuggling
// ---------------------------------------------------------------------------------------

/// A request whose body or framing hides a second request (`POST /v1/embeddings`, which the
/// upstream must never see).
fn smuggled(framing: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\n{framing}\r\n{body}"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_attempts_never_reach_the_upstream_as_two_requests() {
    let rec = Recorder::start().await;
    let g = start_with(Setup {
        extra_config: rec.config(),
        ..Setup::default()
    });
    let chat = r#"{"model":"recorded","messages":[{"role":"user","content":"hi"}]}"#;
    let inner = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: 36\r\n\r\n\
         {{\"model\":\"recorded\",\"input\":\"hi\"}} "
    );
    let chunked = format!("{:x}\r\n{chat}\r\n0\r\n\r\n", chat.len());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // CL.TE: the length covers the smuggled request, the chunked framing ends before it.
        (
            "CL+TE",
            smuggled(
                &format!(
                    "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
                    chunked.len() + inner.len()
                ),
                &format!("{chunked}{inner}"),
            ),
        ),
        // TE.CL: the chunked body holds the smuggled request, the length stops short.
        (
            "TE+CL",
            smuggled(
                "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
                &format!(
                    "{:x}\r\n{chat}{inner}\r\n0\r\n\r\n",
                    chat.len() + inner.len()
                ),
            ),
        ),
        (
            "two different lengths",
            smuggled(
                &format!(
                    "Content-Length: {}\r\nContent-Length: {}\r\n",
                    chat.len(),
                    chat.len() + inner.len()
                ),
                &format!("{chat}{inner}"),
            ),
        ),
        (
            "a list of lengths",
            smuggled(
                &format!(
                    "Content-Length: {}, {}\r\n",
                    chat.len(),
                    chat.len() + inner.len()
                ),
                &format!("{chat}{inner}"),
            ),
        ),
        (
            "obfuscated TE",
            smuggled(
                &format!(
                    "Content-Length: {}\r\nTransfer-Encoding: xchunked\r\n",
                    chat.len()
                ),
                &format!("{chat}{inner}"),
            ),
        ),
        (
            "TE with a space before the colon",
            smuggled(
                &format!(
                    "Content-Length: {}\r\nTransfer-Encoding : chunked\r\n",
                    chunked.len() + inner.len()
                ),
                &format!("{chunked}{inner}"),
            ),
        ),
        (
            "TE folded onto a second line",
            smuggled(
                &format!(
                    "Content-Length: {}\r\nTransfer-Encoding:\r\n chunked\r\n",
                    chunked.len() + inner.len()
                ),
                &format!("{chunked}{inner}"),
            ),
        ),
        (
            "a chunk size that overflows",
            smuggled(
                "Transfer-Encoding: chunked\r\n",
                &format!("ffffffffffffffffffff1\r\n{chat}\r\n0\r\n\r\n{inner}"),
            ),
        ),
        (
            "a negative length",
            smuggled("Content-Length: -1\r\n", &format!("{chat}{inner}")),
        ),
        (
            "a length with a plus sign",
            smuggled(
                &format!("Content-Length: +{}\r\n", chat.len()),
                &format!("{chat}{inner}"),
            ),
        ),
    ];
    for (name, bytes) in &cases {
        let before = rec.seen().len();
        let reply = tokio::task::block_in_place(|| raw(&g.main, bytes));
        let answered = statuses(&reply);
        let seen = rec.seen();
        let new = &seen[before..];
        // At most one request went up, and only the outer one, framed by an exact length.
        assert!(new.len() <= 1, "{name}: {} upstream requests", new.len());
        for s in new {
            assert!(
                s.head.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
                "{name}: {}",
                s.head
            );
            let head = s.head.to_ascii_lowercase();
            assert!(!head.contains("transfer-encoding"), "{name}: {head}");
            assert!(head.contains(&format!("content-length: {}\r\n", s.body.len())));
            // The outer body, its model spliced to the upstream's name.
            assert_eq!(
                String::from_utf8_lossy(&s.body),
                chat.replace("\"recorded\"", "\"echo-1\""),
                "{name}: the upstream got another body"
            );
        }
        // The smuggled request was not answered either: one reply (a 4xx refusal, or the
        // outer request's answer), never two.
        assert!(answered.len() <= 1, "{name}: {answered:?}\n{reply}");
        assert!(
            answered
                .first()
                .is_none_or(|s| *s == 200 || (400..500).contains(s)),
            "{name}: {answered:?}"
        );
        assert_eq!(answered.first() == Some(&200), new.len() == 1, "{name}");
    }
    let wire = String::from_utf8_lossy(&rec.wire()).into_owned();
    assert!(
        !wire.contains("/v1/embeddings"),
        "smuggled upstream:\n{wire}"
    );
    // The gateway is still up and serves the next client.
    let resp = post_json(
        &g.main,
        "/v1/chat/completions",
        &chat_body("recorded", false),
    )
    .await;
    assert_eq!(resp.status(), 200);
}

// ---------------------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_or_credential_in_logs_metrics_records_error_bodies_or_the_upstream_request() {
    let rec = Recorder::start().await;
    let g = start_with(Setup {
        extra_config: rec.config(),
        env: vec![("RUST_LOG".into(), "trace".into())],
        server_extra: String::new(),
        ..Setup::default()
    });
    let wrong = "sk-wrong-but-secret-998877";
    let mut emitted = String::new();
    let keep = |resp: reqwest::Response| async {
        let mut text = format!("{:?}\n", resp.headers());
        text.push_str(&resp.text().await.unwrap_or_default());
        text
    };
    for base in g.bases() {
        for (key, model, stream) in [
            (KEY, "recorded", false),
            (KEY, "recorded", true),
            (wrong, "recorded", false),
            (KEY, "no-such-model", false),
            (ECHO_ONLY_KEY, "recorded", false),
            (KEY, "gone-model", false),
        ] {
            let resp = send(
                &base,
                "/v1/chat/completions",
                Some(key),
                &chat_body(model, stream),
                &[],
            )
            .await;
            emitted += &keep(resp).await;
        }
        // A key in the URL is refused without being echoed.
        emitted += &keep(get(&base, &format!("/api/usage?api_key={KEY}"), None).await).await;
        emitted += &keep(
            send(
                &base,
                "/v1/messages",
                None,
                &json!({"model": "recorded", "max_tokens": 5,
                        "messages": [{"role": "user", "content": "hi"}]}),
                &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
            )
            .await,
        )
        .await;
    }
    // The records (JSON and CSV) and the metrics.
    emitted += &get(&g.direct, "/api/usage?limit=1000", Some(KEY))
        .await
        .text()
        .await
        .expect("usage");
    emitted += &get(&g.direct, "/api/usage.csv", Some(KEY))
        .await
        .text()
        .await
        .expect("csv");
    emitted += &metrics_text(&g).await;
    assert!(emitted.contains("recorded"), "the run was recorded");
    let wire = String::from_utf8_lossy(&rec.wire()).into_owned();
    assert!(
        wire.contains(&format!("authorization: Bearer {POOL_KEY}"))
            || wire.contains(&format!("Authorization: Bearer {POOL_KEY}")),
        "the upstream got its credential:\n{wire}"
    );
    let (_, stderr) = tokio::task::block_in_place(|| g.terminate_and_stderr());
    assert!(stderr.len() > 1_000, "trace output expected");
    for secret in [KEY, ECHO_ONLY_KEY, wrong, POOL_KEY] {
        for (what, text) in [
            ("the log", &stderr),
            ("replies, records or metrics", &emitted),
        ] {
            let hit = text.lines().find(|l| l.contains(secret));
            assert!(hit.is_none(), "{secret} in {what}: {hit:?}");
        }
    }
    for secret in [KEY, ECHO_ONLY_KEY, wrong] {
        assert!(!wire.contains(secret), "{secret} sent upstream:\n{wire}");
    }
}

// ---------------------------------------------------------------------------------------
// Packaging
// ---------------------------------------------------------------------------------------

#[test]
fn the_docker_image_runs_as_a_non_root_user() {
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile"))
        .expect("Dockerfile");
    let last_stage = dockerfile
        .rsplit_once("\nFROM ")
        .map(|(_, s)| s)
        .expect("a run stage");
    let users: Vec<&str> = last_stage
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .collect();
    assert_eq!(
        users.last().map(|u| u.trim()),
        Some("modelgate"),
        "{users:?}"
    );
    assert!(
        last_stage.contains("useradd --system --uid 10001"),
        "the service user has a fixed non-zero uid"
    );
    let user_at = last_stage.find("USER modelgate").expect("USER");
    let entry_at = last_stage.find("ENTRYPOINT").expect("ENTRYPOINT");
    assert!(
        user_at < entry_at,
        "the entry point runs as the service user"
    );
}

/// A key in the URL, however its parameter is spelled or encoded, or under any name at all, is
/// refused before anything goes upstream, and never repeated: neither in the reply nor the log.
/// A key pasted as a model id gets a 404 that does not repeat it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_the_url_in_any_spelling_is_refused_and_never_repeated() {
    let rec = Recorder::start().await;
    let mut g = start_with(Setup {
        extra_config: rec.config() + "\n[log]\naccess_file = \"access.log\"\n",
        ..Setup::default()
    });
    let body = chat_body("recorded", false);
    for q in [
        format!("api-key={KEY}"),
        format!("apiKey={KEY}"),
        format!("api%5Fkey={KEY}"),
        format!("%61pi_key={KEY}"),
        format!("X-Api-Key={KEY}"),
        format!("access-token={KEY}"),
        format!("anything={KEY}"),
        format!("q={}", KEY.replace('-', "%2D")),
        // Inside a value, as a bare word, encoded twice.
        format!("q=Bearer%20{KEY}"),
        format!("q=Bearer+{KEY}"),
        KEY.to_string(),
        format!("{KEY}=1"),
        format!("q=%22{KEY}%22"),
        format!("q=%2573{}", &KEY[1..]),
    ] {
        for base in [&g.main, &g.direct] {
            let resp = send(
                base,
                &format!("/v1/chat/completions?{q}"),
                Some(KEY),
                &body,
                &[],
            )
            .await;
            let (status, e) = error_of(resp).await;
            assert_eq!(
                (status, e["code"].as_str()),
                (400, Some("invalid_parameter")),
                "{q}"
            );
            assert!(!e.to_string().contains(KEY), "{e}");
            let resp = get(base, &format!("/api/usage?{q}"), Some(KEY)).await;
            assert_eq!(error_of(resp).await.0, 400, "{q}");
        }
    }
    assert!(
        rec.seen().is_empty(),
        "a request with a key in its URL went upstream"
    );
    // A query that carries no key is not refused for it.
    let resp = send(
        &g.main,
        "/v1/chat/completions?beta=true",
        Some(KEY),
        &body,
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    for id in [KEY.to_string(), format!("Bearer%20{KEY}")] {
        let resp = get(&g.main, &format!("/v1/models/{id}"), Some(KEY)).await;
        let (status, e) = error_of(resp).await;
        assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")));
        assert!(!e.to_string().contains(KEY), "{e}");
    }
    // As the model of a call, or a path the `other` group would send on.
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body(&format!("Bearer {KEY}"), false),
        &[],
    )
    .await;
    let id = request_id(&resp);
    let (status, e) = error_of(resp).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")));
    assert!(!e.to_string().contains(KEY), "{e}");
    let record = await_record(&g, &id).await;
    assert_eq!(record["model"], "[redacted]", "{record}");
    let resp = get(&g.main, &format!("/v1/responses/{KEY}"), Some(KEY)).await;
    let (status, e) = error_of(resp).await;
    assert_eq!(status, 404);
    assert!(!e.to_string().contains(KEY), "{e}");
    let resp = send(&g.main, &format!("/v1/x/{KEY}"), Some(KEY), &body, &[]).await;
    let (status, e) = error_of(resp).await;
    assert_eq!(status, 404);
    assert!(!e.to_string().contains(KEY), "{e}");
    assert!(
        rec.seen().iter().all(|s| !s.head.contains(KEY)),
        "a key in a path went upstream"
    );
    // SIGTERM: the access log's lines are all written before the exit.
    g.terminate();
    let access = std::fs::read_to_string(g.dir.path().join("access.log")).expect("access log");
    let log = g.take_stderr();
    assert!(!log.contains(KEY), "the key is in the log");
    assert!(!access.contains(KEY), "the key is in the access log");
    assert!(access.contains("\"path\":\"[redacted]\""), "{access}");
}

/// Hop-by-hop headers describe the client's connection, not the request: none goes upstream
/// (nor a header `Connection` names), so a client's `Connection: close` does not close the
/// pool's connection either; nor do the client's `Forwarded`/`X-Forwarded-*`/`X-Real-IP`. The upstream's rate-limit headers describe the pool's account:
/// the client sees its key's own, or none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_stay_on_their_hop_and_the_upstreams_limits_stay_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rec = Recorder::start().await;
    let g = start_with(Setup {
        extra_config: rec.config(),
        ..Setup::default()
    });
    let body = serde_json::to_vec(&chat_body("recorded", false)).expect("json");
    let mut s = raw_connect(&g.main).await;
    let head = chat_head(
        KEY,
        body.len(),
        "Connection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
         Upgrade: h2c\r\nProxy-Connection: keep-alive\r\nTrailer: x-t\r\nX-Kept: 1\r\n\
         X-Forwarded-For: 6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\n\
         X-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Port: 1\r\n",
    );
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(&body).await.expect("body");
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).await.expect("reply");
    let reply = String::from_utf8_lossy(&reply).to_ascii_lowercase();
    assert!(reply.starts_with("http/1.1 200"), "{reply}");
    assert!(
        !reply.contains("x-ratelimit-"),
        "the upstream's limits: {reply}"
    );
    let seen = rec.seen();
    let up = seen
        .last()
        .expect("sent upstream")
        .head
        .to_ascii_lowercase();
    for gone in [
        "x-hop",
        "keep-alive:",
        "\r\nte:",
        "upgrade:",
        "proxy-connection:",
        "trailer:",
        "connection:",
        // Who and where the client is (anything it likes to write there) is no upstream's
        // business either.
        "6.6.6.6",
        "forwarded",
        "evil.example",
        "x-real-ip",
    ] {
        assert!(!up.contains(gone), "{gone} went upstream: {up}");
    }
    assert!(up.contains("x-kept: 1"), "{up}");
    assert!(up.contains("x-request-id:"), "{up}");
    // A key with an rpm sees its own limits, not the upstream's.
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(RPM100_KEY),
        &chat_body("recorded", false),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-ratelimit-limit-requests"], "100");
}
