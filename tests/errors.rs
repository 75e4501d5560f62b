//! Every error the gateway makes has the contract's status, code and JSON shape, on both
//! listeners; upstream errors pass through unchanged except the upstream's own 401/403.

mod common;

use common::*;
use serde_json::json;

async fn chat_with_key(
    base: &str,
    key: Option<&str>,
    body: &serde_json::Value,
) -> reqwest::Response {
    send(base, "/v1/chat/completions", key, body, &[]).await
}

#[tokio::test]
async fn missing_unknown_disabled_and_expired_keys_are_401_invalid_api_key() {
    let g = start();
    for base in g.bases() {
        for key in [
            None,
            Some("sk-unknown-key-123"),
            Some(DISABLED_KEY),
            Some(EXPIRED_KEY),
        ] {
            let (status, e) =
                error_of(chat_with_key(&base, key, &chat_body("echo-1", false)).await).await;
            assert_eq!(
                (status, e["code"].as_str()),
                (401, Some("invalid_api_key")),
                "{key:?} on {base}"
            );
        }
        let resp = client()
            .get(format!("{base}/v1/models"))
            .header("authorization", "Basic abc")
            .send()
            .await
            .expect("send");
        assert_eq!(error_of(resp).await.0, 401);
    }
}

#[tokio::test]
async fn a_key_in_the_url_is_refused_even_with_a_good_header() {
    let g = start();
    let resp = get(&g.main, &format!("/v1/models?api_key={KEY}"), Some(KEY)).await;
    let (status, e) = error_of(resp).await;
    assert_eq!((status, e["param"].as_str()), (400, Some("api_key")));
    let path = format!("/v1/chat/completions?key={KEY}");
    let resp = send(
        &g.direct,
        &path,
        Some(KEY),
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    let (status, e) = error_of(resp).await;
    assert_eq!((status, e["param"].as_str()), (400, Some("api_key")));
}

#[tokio::test]
async fn a_client_waiting_for_100_continue_gets_it_and_then_its_reply() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    let body = serde_json::to_vec(&chat_body("echo-1", false)).expect("json");
    let mut s = raw_connect(&g.main).await;
    let head = chat_head(KEY, body.len(), "Expect: 100-continue\r\n");
    s.write_all(head.as_bytes()).await.expect("head");
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("100 in time")
        .expect("read");
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    s.write_all(&body).await.expect("body");
    let reply = read_raw_until(&mut s, std::time::Duration::from_secs(5), |r| {
        String::from_utf8_lossy(r).contains("chat.completion")
    })
    .await;
    let reply = String::from_utf8_lossy(&reply).to_ascii_lowercase();
    assert!(reply.contains("200 ok"), "{reply}");
    // The connection stays for the next request (the interim reply turned keep-alive off).
    assert!(reply.contains("connection: keep-alive"), "{reply}");
    let models = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ".to_string()
        + KEY
        + "\r\nConnection: close\r\n\r\n";
    s.write_all(models.as_bytes()).await.expect("next request");
    let mut next = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        s.read_to_string(&mut next),
    )
    .await
    .expect("next reply in time")
    .expect("read");
    assert!(next.contains("200 OK") && next.contains("echo-1"), "{next}");

    // HTTP/1.0 knows no interim replies: its body is read without one.
    let mut s = raw_connect(&g.main).await;
    let head =
        chat_head(KEY, body.len(), "Expect: 100-continue\r\n").replacen("HTTP/1.1", "HTTP/1.0", 1);
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(&body).await.expect("body");
    let mut reply = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        s.read_to_string(&mut reply),
    )
    .await
    .expect("reply in time")
    .expect("read");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

/// Refused before its `100 Continue` (a wrong key), the client never sends its body: the
/// answer comes at once, says `Connection: close` and the connection ends (its body would
/// otherwise be read as the next request).
#[tokio::test]
async fn a_client_refused_before_its_100_continue_gets_the_answer_and_a_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    // A large body and a small one (which a refusal would otherwise drain first).
    for length in [100_000, 61] {
        let mut s = raw_connect(&g.main).await;
        let head = chat_head("sk-wrong", length, "Expect: 100-continue\r\n");
        s.write_all(head.as_bytes()).await.expect("head");
        let asked = std::time::Instant::now();
        let mut reply = Vec::new();
        loop {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut chunk))
                .await
                .expect("the connection ends")
                .expect("read");
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&chunk[..n]);
        }
        // Not held open for the 2 s a refused upload is given to finish: there is nothing to
        // drain.
        assert!(
            asked.elapsed() < std::time::Duration::from_millis(1500),
            "{length}"
        );
        let text = String::from_utf8_lossy(&reply).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 401"), "{text}");
        assert!(!text.contains("100 continue"), "{text}");
        assert!(text.contains("connection: close"), "{text}");
        assert!(text.contains("invalid_api_key"), "{text}");
    }
    // HTTP/1.0 knows no `100 Continue`: its body comes at once with the header, and is read
    // and dropped so that the client reads its answer (the connection was closed on it unread,
    // a reset that can take the answer with it).
    let body = vec![b'x'; 300_000];
    let mut s = raw_connect(&g.main).await;
    let head = chat_head("sk-wrong", body.len(), "Expect: 100-continue\r\n")
        .replacen("HTTP/1.1", "HTTP/1.0", 1);
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(&body).await.expect("body");
    let mut reply = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_string(&mut reply),
    )
    .await
    .expect("the connection ends")
    .expect("the answer, not a reset");
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
}

#[tokio::test]
async fn unknown_model_is_404_model_not_found_on_both_listeners() {
    let g = start();
    for base in g.bases() {
        let (status, e) = error_of(
            post_json(
                &base,
                "/v1/chat/completions",
                &chat_body("no-such-model", false),
            )
            .await,
        )
        .await;
        assert_eq!(status, 404);
        assert_eq!(e["code"], "model_not_found");
        assert_eq!(e["type"], "invalid_request_error");
        assert_eq!(e["param"], "model");
    }
}

#[tokio::test]
async fn unknown_path_is_404_not_found() {
    let g = start();
    for base in g.bases() {
        for (method, path) in [
            ("POST", "/v1/nope"),
            ("GET", "/v2/models"),
            ("GET", "/nope"),
            ("GET", "/api/usage/nope"),
            ("POST", "/api/usage"),
        ] {
            let req = client()
                .request(method.parse().expect("method"), format!("{base}{path}"))
                .bearer_auth(KEY);
            let (status, e) = error_of(req.send().await.expect("send")).await;
            assert_eq!(
                (status, e["code"].as_str()),
                (404, Some("not_found")),
                "{method} {path}"
            );
        }
    }
}

#[tokio::test]
async fn bad_bodies_are_400_with_the_contract_codes() {
    let g = start();
    for base in g.bases() {
        let send_raw = |body: &'static str| {
            client()
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(KEY)
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let (status, e) = error_of(send_raw("{not json").await.expect("send")).await;
        assert_eq!((status, e["code"].as_str()), (400, Some("invalid_json")));
        let (status, e) = error_of(send_raw(r#"{"messages":[]}"#).await.expect("send")).await;
        assert_eq!(
            (status, e["code"].as_str(), e["param"].as_str()),
            (400, Some("missing_required_parameter"), Some("model"))
        );
        let (status, e) = error_of(send_raw("").await.expect("send")).await;
        assert_eq!((status, e["code"].as_str()), (400, Some("invalid_json")));
        let (status, e) = error_of(send_raw(r#"{"model":42}"#).await.expect("send")).await;
        assert_eq!(
            (status, e["code"].as_str(), e["param"].as_str()),
            (400, Some("invalid_parameter"), Some("model"))
        );
        // A chat completion names its conversation: `messages`, an array.
        for (body, code) in [
            (r#"{"model":"echo-1"}"#, "missing_required_parameter"),
            (
                r#"{"model":"echo-1","messages":null}"#,
                "missing_required_parameter",
            ),
            (r#"{"model":"echo-1","messages":"hi"}"#, "invalid_parameter"),
        ] {
            let (status, e) = error_of(send_raw(body).await.expect("send")).await;
            assert_eq!(
                (status, e["code"].as_str(), e["param"].as_str()),
                (400, Some(code), Some("messages")),
                "{body}"
            );
        }
        // A multipart upload without a model field.
        let form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(vec![1, 2, 3]).file_name("a.wav"),
        );
        let resp = client()
            .post(format!("{base}/v1/audio/transcriptions"))
            .bearer_auth(KEY)
            .multipart(form)
            .send()
            .await
            .expect("send");
        let (status, e) = error_of(resp).await;
        assert_eq!((status, e["param"].as_str()), (400, Some("model")));
    }
}

#[tokio::test]
async fn refused_model_and_endpoint_are_403_permission_denied() {
    let g = start();
    for base in g.bases() {
        let (status, e) = error_of(
            chat_with_key(&base, Some(ECHO_ONLY_KEY), &chat_body("big-model", false)).await,
        )
        .await;
        assert_eq!(
            (status, e["code"].as_str(), e["param"].as_str()),
            (403, Some("permission_denied"), Some("model"))
        );
        let (status, e) = error_of(
            chat_with_key(&base, Some(MODELS_ONLY_KEY), &chat_body("echo-1", false)).await,
        )
        .await;
        assert_eq!(
            (status, e["code"].as_str(), e["param"].as_str()),
            (403, Some("permission_denied"), Some("endpoint"))
        );
        let ok = get(&base, "/v1/models", Some(MODELS_ONLY_KEY)).await;
        assert_eq!(ok.status(), 200);
    }
}

#[tokio::test]
async fn unreachable_upstreams_are_502_then_503_while_every_one_is_out_of_rotation() {
    let g = start_with(Setup {
        extra_config: ALL_DEAD_POOL.into(),
        ..Setup::default()
    });
    let ask = |base: String, model: &'static str| async move {
        error_of(post_json(&base, "/v1/chat/completions", &chat_body(model, false)).await).await
    };
    // A pool of one never leaves rotation on what requests see: each request tries it.
    for base in g.bases() {
        let (status, e) = ask(base, "gone-model").await;
        assert_eq!((status, e["code"].as_str()), (502, Some("upstream_error")));
    }
    // A pool of two: the first request tries both and fails; then none is healthy.
    let (status, e) = ask(g.main.clone(), "all-dead-model").await;
    assert_eq!((status, e["code"].as_str()), (502, Some("upstream_error")));
    for base in g.bases() {
        let started = std::time::Instant::now();
        let (status, e) = ask(base, "all-dead-model").await;
        assert_eq!(
            (status, e["code"].as_str()),
            (503, Some("no_healthy_upstream"))
        );
        assert!(started.elapsed() < std::time::Duration::from_millis(500));
    }
}

/// An upstream whose connect never completes (its accept queue is full, so the SYN is
/// dropped, as by a firewall) is unreachable: 502 after `connect_timeout_ms`, not 504.
#[tokio::test]
async fn an_upstream_that_never_accepts_is_502_after_the_connect_timeout() {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let hole = socket.listen(0).expect("listen");
    let addr = hole.local_addr().expect("addr");
    // One connection fills a backlog of 0; the next connects hang.
    let _filler = std::net::TcpStream::connect(addr).expect("filler");
    let probe = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(300));
    assert!(probe.is_err(), "the backlog must be full for this test");
    let g = start_with(Setup {
        extra_config: format!(
            "[[pools]]\nname = \"hole\"\nupstreams = [\"http://{addr}\"]\nhealth_interval_ms = 0\n\
             connect_timeout_ms = 300\nmax_attempts = 1\n\n\
             [[models]]\nname = \"hole-model\"\npool = \"hole\"\n"
        ),
        ..Setup::default()
    });
    let started = std::time::Instant::now();
    let (status, e) = error_of(
        post_json(
            &g.main,
            "/v1/chat/completions",
            &chat_body("hole-model", false),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, e["code"].as_str()),
        (502, Some("upstream_error")),
        "{e}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(hole);
}

#[tokio::test]
async fn upstream_401_and_403_become_502_upstream_error() {
    let g = start();
    for (code, empty) in [("401", "0"), ("403", "0"), ("401", "1"), ("403", "1")] {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body("echo-1", false),
            &[("x-mock-status", code), ("x-mock-empty-body", empty)],
        )
        .await;
        // Also when the upstream's refusal has no body: the client still gets a whole reply.
        let (status, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (502, Some("upstream_error")),
            "upstream {code}, empty body {empty}"
        );
    }
}

/// 429 and 5xx are tried again (`max_attempts`, 3 by default); when every try fails the same
/// way, the last reply passes through unchanged. 400 is never retried.
#[tokio::test]
async fn other_upstream_errors_pass_through_unchanged() {
    let g = start();
    for code in ["400", "429", "500", "503"] {
        let (path, body) = ("/v1/chat/completions", chat_body("echo-1", false));
        let headers = [("x-mock-status", code)];
        let upstream = send(&g.mock, path, Some(KEY), &body, &headers).await;
        let through = send(&g.direct, path, Some(KEY), &body, &headers).await;
        assert_eq!(through.status(), upstream.status());
        assert!(through.headers().contains_key("x-request-id"));
        assert_eq!(
            through.bytes().await.expect("body"),
            upstream.bytes().await.expect("body"),
            "upstream {code}"
        );
    }
}

#[tokio::test]
async fn a_slow_upstream_is_504_upstream_timeout() {
    let g = start_with(Setup {
        read_timeout_ms: 300,
        ..Setup::default()
    });
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &json!({"model": "echo-1", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        &[("x-mock-delay-ms", "3000"), ("x-mock-chunks", "2")],
    )
    .await;
    // The mock sends its header at once and then stalls between events: the reply has begun,
    // so the client sees the stream cut (never a hang, never a [DONE]), and the record says
    // 504, the stall. A non-streamed slow reply is a 504.
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    if let Ok(body) = resp.bytes().await {
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("[DONE]"), "a stalled stream looked complete");
    }
    let r = await_record(&g, &id).await;
    assert_eq!(r["status"], 504, "{r}");
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", false),
        &[("x-mock-delay-ms", "3000")],
    )
    .await;
    let (status, e) = error_of(resp).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (504, Some("upstream_timeout"))
    );
}

#[tokio::test]
async fn an_upstream_answering_garbage_is_502_or_a_cut_reply() {
    let g = start();
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", false),
        &[("x-mock-garbage", "1")],
    )
    .await;
    // The header arrived before the body broke, so the client gets the header and then a
    // body that fails to complete — never a hang, never a silent success.
    let complete = resp.bytes().await;
    assert!(
        complete.is_err(),
        "a truncated upstream body must not look complete"
    );
}

#[tokio::test]
async fn a_known_path_with_the_wrong_method_is_405_with_allow() {
    let g = start();
    for base in g.bases() {
        for (method, path, allow) in [
            (reqwest::Method::GET, "/v1/chat/completions", "POST"),
            (reqwest::Method::PUT, "/v1/embeddings", "POST"),
            (reqwest::Method::POST, "/v1/models", "GET, HEAD"),
            (reqwest::Method::DELETE, "/v1/models/echo-1", "GET, HEAD"),
        ] {
            let resp = client()
                .request(method.clone(), format!("{base}{path}"))
                .bearer_auth(KEY)
                .send()
                .await
                .expect("send");
            assert_eq!(
                resp.headers().get("allow").map(|v| v.as_bytes()),
                Some(allow.as_bytes())
            );
            let (status, e) = error_of(resp).await;
            assert_eq!(
                (status, e["code"].as_str()),
                (405, Some("method_not_allowed")),
                "{method} {path}"
            );
        }
        // An unknown path stays 404.
        let (status, _) = error_of(get(&base, "/v1/nope", Some(KEY)).await).await;
        assert_eq!(status, 404);
    }
}

/// An upstream error with no body or a non-JSON one (a proxy's HTML page) reaches the client
/// in the contract's error shape, its status kept; it is not retried when it is a 4xx.
#[tokio::test]
async fn upstream_errors_without_a_json_body_are_wrapped_with_their_status() {
    let g = start();
    for (code, how) in [
        ("404", "x-mock-empty-body"),
        ("422", "x-mock-text-body"),
        ("500", "x-mock-empty-body"),
        ("503", "x-mock-text-body"),
    ] {
        let resp = send(
            &g.direct,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body("echo-1", false),
            &[("x-mock-status", code), (how, "1")],
        )
        .await;
        assert_eq!(
            resp.headers()["content-type"].to_str().ok(),
            Some("application/json"),
            "{code} {how}"
        );
        let (status, e) = error_of(resp).await;
        assert_eq!(status.to_string(), code, "{how}");
        assert_eq!(e["code"], "upstream_error", "{code} {how}: {e}");
        let message = e["message"].as_str().unwrap_or("");
        assert!(message.contains(code), "{message}");
        if how == "x-mock-text-body" {
            assert!(message.contains("502 Bad Gateway (nginx)"), "{message}");
        }
    }
}

/// A request Pingora cannot parse gets the contract's JSON 400 with an `x-request-id`, on both
/// listeners, and the connection closes; the next connection is served as usual.
#[tokio::test]
async fn an_unparseable_request_gets_the_contracts_400() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    for base in g.bases() {
        let addr = base.trim_start_matches("http://").to_string();
        for raw in [
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nthis header has no colon\r\n\r\n",
            "GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n",
            "GET /v1/models HTTP/1.1\r\nHost: x\r\n: no name\r\n\r\n",
            "GET\r\n\r\n",
            "\u{1}\u{2}\u{3} nonsense\r\n\r\n",
            // A space too many around the target (Pingora escapes it rather than refuse it).
            "GET  /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /v1/models  HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            let mut s = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            s.write_all(raw.as_bytes()).await.expect("write");
            let mut reply = Vec::new();
            tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut reply))
                .await
                .expect("the gateway answers and closes")
                .expect("read");
            let text = String::from_utf8_lossy(&reply);
            let (head, body) = text.split_once("\r\n\r\n").expect("a whole reply");
            let head = head.to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 400"), "{raw:?}: {text}");
            assert!(head.contains("content-type: application/json"), "{text}");
            assert!(head.contains("x-request-id: req_"), "{text}");
            let v: serde_json::Value = serde_json::from_str(body).expect("json body");
            assert_eq!(v["error"]["code"], "invalid_parameter", "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        }
        let resp = get(&base, "/v1/models", Some(KEY)).await;
        assert_eq!(resp.status(), 200);
    }
    // Counted as requests of each listener (no endpoint, no model): the five Pingora cannot
    // read, as refusals `unparseable` too, and the three with a space too many, which the
    // gateway refuses itself.
    let text = metrics_text(&g).await;
    for listener in ["main", "direct"] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("modelgate_requests_total{")
                    && l.contains(&format!("listener=\"{listener}\""))
                    && l.contains("endpoint=\"none\"")
                    && l.contains("status=\"400\"")
            })
            .unwrap_or_else(|| panic!("no unparseable requests on {listener}:\n{text}"));
        assert!(line.ends_with(" 8"), "{line}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("modelgate_refusals_total{")
                && l.contains("unparseable")
                && l.ends_with(" 10")),
        "{text}"
    );
}

/// A later request on a kept-alive connection is read by Pingora alone (only a connection's
/// first header is pre-read): one it cannot parse still gets a 400, and the connection closes
/// (Pingora's own reply, without the contract's body).
#[tokio::test]
async fn an_unparseable_request_after_a_good_one_gets_a_400_and_the_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    let addr = g.main.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let first =
        format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    s.write_all(first.as_bytes()).await.expect("write");
    // The first reply, whole, before the second request goes.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"object\":\"list\"") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("the first reply comes")
            .expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nthis header has no colon\r\n\r\n")
        .await
        .expect("write");
    let mut rest = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("the gateway answers and closes")
        .expect("read");
    let text = String::from_utf8_lossy(&rest);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
}

/// Two `Authorization` (or `x-api-key`) headers: which one counts would be a guess, so 400,
/// whichever comes first. HEAD on the model list answers as GET does, without the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_authorization_headers_are_refused_and_head_on_models_answers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    for (path, first, second) in [
        ("/v1/models", KEY, "sk-wrong"),
        ("/v1/models", "sk-wrong", KEY),
        ("/api/usage", KEY, KEY),
    ] {
        let mut s = raw_connect(&g.main).await;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {first}\r\n\
             Authorization: Bearer {second}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("write");
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).await.expect("read");
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with("HTTP/1.1 400"), "{path}: {reply}");
        assert!(reply.contains("\"param\":\"authorization\""), "{reply}");
        assert!(!reply.contains(KEY), "{reply}");
    }
    // On the wire: HEAD's header, no body, and the connection serves the next request.
    let mut s = raw_connect(&g.main).await;
    let req = |method: &str| {
        format!("{method} /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n")
    };
    s.write_all((req("HEAD") + &req("GET")).as_bytes())
        .await
        .expect("write");
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while String::from_utf8_lossy(&got)
        .matches("HTTP/1.1 200")
        .count()
        < 2
        || !got.ends_with(b"}")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&got)
        );
        let mut buf = [0u8; 8192];
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let (head, get) = text.split_at(text.rfind("HTTP/1.1 200").unwrap_or(0));
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    assert!(head.ends_with("\r\n\r\n"), "HEAD had a body: {head}");
    assert!(get.contains("\"object\":\"list\""), "{get}");
    let resp = client()
        .post(format!("{}/v1/models", g.main))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.headers()["allow"], "GET, HEAD");
}

/// A client that resets its connection right behind its request, to a model whose upstream
/// cannot be reached: the gateway's 502 finds no one to take it. The record says the client
/// left (499), not the error it never got.
#[tokio::test]
async fn an_error_reply_whose_client_reset_the_connection_is_recorded_499() {
    let g = start();
    let body = serde_json::to_string(&chat_body("gone-model", false)).expect("json");
    let addr = g.main.trim_start_matches("http://").parse().expect("addr");
    let client = tokio::net::TcpSocket::new_v4()
        .expect("socket")
        .connect(addr)
        .await
        .expect("connect");
    // Closing with a zero linger resets the connection: the request's bytes are in the
    // gateway's socket, and anything it writes after them fails.
    client.set_zero_linger().expect("linger");
    let mut client = client;
    tokio::io::AsyncWriteExt::write_all(
        &mut client,
        (chat_head(KEY, body.len(), "") + &body).as_bytes(),
    )
    .await
    .expect("request");
    drop(client);
    // The reads of the usage API are recorded too (under the same key), and one can be written
    // before the chat request's record: look for that one.
    let within = std::time::Duration::from_secs(5);
    let record = common::await_record_where(
        &common::client(),
        &g.direct,
        KEY,
        within,
        "no record",
        |r| r["model"] == "gone-model",
    )
    .await;
    assert_eq!(
        (record["model"].as_str(), record["status"].as_u64()),
        (Some("gone-model"), Some(499)),
        "{record}"
    );
}
