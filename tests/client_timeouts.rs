//! Deadlines on the client side: a body that stalls gets 408 (recorded as the client's), and
//! an idle keep-alive connection is closed. Pipelined HTTP/1.1 requests are answered in order,
//! under the same header deadline.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_a_record_saying_so() {
    let g = start_with(Setup {
        server_extra: "client_body_timeout_ms = 500".into(),
        ..Setup::default()
    });
    let (status, body, took) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.direct, Duration::from_secs(10));
        // The body is cut short: 13 of its 100 bytes.
        let head = chat_head(KEY, 100, "") + "{\"model\": \"ec";
        let started = Instant::now();
        s.write_all(head.as_bytes()).expect("write");
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        let reply = String::from_utf8_lossy(&reply).into_owned();
        let status = reply.split(' ').nth(1).unwrap_or("").to_string();
        (status, reply, started.elapsed())
    });
    assert_eq!(status, "408", "{body}");
    assert!(body.contains("\"request_timeout\""), "{body}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // The key had passed: the request left a record, with the client's status.
    let within = Duration::from_secs(5);
    let r = await_record_where(&client(), &g.main, KEY, within, "no 408 record", |r| {
        r["status"] == 408
    })
    .await;
    // Its latency ends with the 408, not with the drain of the upload after it.
    let latency = r["latency_ms"].as_u64().unwrap_or(0);
    assert!((450..1_500).contains(&latency), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_its_timeout() {
    let g = start_with(Setup {
        server_extra: "keepalive_timeout_ms = 1000".into(),
        ..Setup::default()
    });
    let (first, closed_after) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(15));
        let first = models_over(&mut s);
        let idle = Instant::now();
        let mut buf = [0u8; 65536];
        // Drain the rest of the reply if any, then wait for the close.
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        (first, idle.elapsed())
    });
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        closed_after >= Duration::from_millis(800),
        "{closed_after:?}"
    );
    assert!(closed_after < Duration::from_secs(4), "{closed_after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_is_cut_at_its_deadline_but_an_idle_keep_alive_is_not() {
    let g = start_with(Setup {
        server_extra: "client_header_timeout_ms = 500".into(),
        ..Setup::default()
    });
    let cut_after = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        trickle_until_cut(&mut s, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    });
    assert!(cut_after >= Duration::from_millis(450), "{cut_after:?}");
    assert!(cut_after < Duration::from_secs(3), "{cut_after:?}");

    // A kept-alive connection idle longer than the header deadline still serves its next
    // request: the deadline starts with that request's first byte.
    let (first, second) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.direct, Duration::from_secs(10));
        let first = models_over(&mut s);
        std::thread::sleep(Duration::from_millis(800));
        (first, models_over(&mut s))
    });
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");

    // Neither that cut nor a client leaving mid-header is an ERROR of the gateway's: anyone
    // could fill its log with those.
    tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        s.write_all(b"POST /v1/chat/comp")
            .expect("part of a header");
        drop(s);
        // A request after it is answered, so the close was seen before the log is read.
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        assert!(models_over(&mut s).starts_with("HTTP/1.1 200"));
    });
    let log = g.stop_and_stderr();
    assert!(!log.contains(" ERROR "), "{log}");
}

/// A connection's first request header is read before the proxy's request is made (to its
/// blank line, or 4 KiB of it): a header that comes in pieces, one longer than that, and one
/// with bare LF line ends are each answered, and the request after it on the connection too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_header_in_pieces_long_or_with_bare_line_feeds_is_answered() {
    let g = start_with(Setup::default());
    let long = "a".repeat(6000);
    let heads = [
        format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n"),
        format!(
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Long: {long}\r\n\
             Authorization: Bearer {KEY}\r\n\r\n"
        ),
        format!("GET /v1/models HTTP/1.1\nHost: x\nAuthorization: Bearer {KEY}\n\n"),
    ];
    for head in heads {
        let (first, next) = tokio::task::block_in_place(|| {
            let mut s = blocking_connect(&g.main, Duration::from_secs(10));
            let bytes = head.as_bytes();
            // In three pieces, the blank line's last byte alone.
            let (a, rest) = bytes.split_at(20);
            let (b, c) = rest.split_at(rest.len() - 1);
            for piece in [a, b, c] {
                s.write_all(piece).expect("piece");
                std::thread::sleep(Duration::from_millis(50));
            }
            (read_one_reply(&mut s), models_over(&mut s))
        });
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        assert!(next.starts_with("HTTP/1.1 200"), "{next}");
    }
}

/// What is not a request header is answered at once, not after the header deadline the
/// pre-read of a first header waits under (10 s here): an HTTP/0.9 request line, and the
/// start of a TLS handshake sent to a plain listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_request_that_is_not_a_header_is_answered_at_once() {
    let g = start_with(Setup::default());
    let tls_hello: &[u8] = &[
        0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03,
    ];
    for start in [&b"GET /\r\n"[..], tls_hello] {
        let (reply, took) = tokio::task::block_in_place(|| {
            let mut s = blocking_connect(&g.main, Duration::from_secs(5));
            let sent = Instant::now();
            s.write_all(start).expect("start");
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).expect("a reply before the read timeout");
            (
                String::from_utf8_lossy(&buf[..n]).into_owned(),
                sent.elapsed(),
            )
        });
        assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
        assert!(reply.contains("invalid_request_error"), "{reply}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_of_a_later_request_on_a_kept_alive_connection_is_cut_too() {
    let g = start_with(Setup {
        server_extra: "client_header_timeout_ms = 500".into(),
        ..Setup::default()
    });
    let (first, cut_after) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        let first = models_over(&mut s);
        // The same connection's next request never ends its header.
        let cut = trickle_until_cut(&mut s, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ");
        (first, cut)
    });
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(cut_after >= Duration::from_millis(450), "{cut_after:?}");
    assert!(cut_after < Duration::from_secs(3), "{cut_after:?}");
}

/// Sends `head`, then one more byte of the header every 100 ms, never its end; how long until
/// the gateway closed the connection (or answered).
fn trickle_until_cut(s: &mut TcpStream, head: &[u8]) -> Duration {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let started = Instant::now();
    s.write_all(head).expect("write");
    let mut buf = [0u8; 1024];
    loop {
        assert!(started.elapsed() < Duration::from_secs(10), "never cut");
        match s.read(&mut buf) {
            Ok(_) => return started.elapsed(),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return started.elapsed(),
        }
        if s.write_all(b"a").is_err() {
            return started.elapsed();
        }
    }
}

/// The body of a chat request to send raw.
fn chat_json(stream: bool) -> String {
    format!(
        r#"{{"model":"echo-1","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

/// Reads one reply with a Content-Length body off `s`; its text.
fn read_one_reply(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).expect("reply");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().expect("length"))
                })
                .expect("content-length");
            if got.len() >= end + 4 + len {
                assert_eq!(got.len(), end + 4 + len, "more than one reply: {text}");
                return text;
            }
        }
    }
}

/// The replies in `raw`, each from its status line on.
fn replies(raw: &str) -> Vec<&str> {
    // A reply's body ends where the next status line starts (these bodies never hold one).
    let starts: Vec<usize> = raw.match_indices("HTTP/1.1 ").map(|(i, _)| i).collect();
    (0..starts.len())
        .map(|k| &raw[starts[k]..starts.get(k + 1).copied().unwrap_or(raw.len())])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_each_with_its_record() {
    let g = start();
    let raw = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.direct, Duration::from_secs(10));
        // Three requests in one write, the last a stream closing the connection.
        let (plain, streamed) = (chat_json(false), chat_json(true));
        let all = chat_head(KEY, plain.len(), "")
            + &plain
            + &format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n")
            + &chat_head(KEY, streamed.len(), "Connection: close\r\n")
            + &streamed;
        s.write_all(all.as_bytes()).expect("write");
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        String::from_utf8_lossy(&raw).into_owned()
    });
    let got = replies(&raw);
    assert_eq!(got.len(), 3, "{raw}");
    for r in &got {
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    assert!(got[0].contains("\"chat.completion\""), "{}", got[0]);
    assert!(got[1].contains("\"list\""), "{}", got[1]);
    assert!(got[2].contains("text/event-stream"), "{}", got[2]);
    assert!(got[2].contains("data: [DONE]"), "{}", got[2]);
    let ids: Vec<String> = got.iter().map(|r| request_id_in(r)).collect();
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );
    for (id, endpoint) in [(&ids[0], "chat"), (&ids[1], "models"), (&ids[2], "chat")] {
        let record = await_record(&g, id).await;
        assert_eq!(record["status"], 200, "{record}");
        assert!(
            record["endpoint"].as_str().unwrap_or("").contains(endpoint),
            "{record}"
        );
    }
    assert_eq!(await_record(&g, &ids[2]).await["stream"], true);
}

/// A stream's reply goes on in a task of its own, which takes its connection along
/// (`proxy::detach`): the requests after it on that connection, sent after its reply or
/// pipelined behind it, are answered from there, in order, each with its record, and a
/// request's header after them is still held to its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_after_a_stream_on_its_connection_are_answered_each_with_its_record() {
    let g = start_with(Setup {
        server_extra: "client_header_timeout_ms = 500".into(),
        ..Setup::default()
    });
    let (raw, cut_after) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        let (plain, streamed) = (chat_json(false), chat_json(true));
        // A stream, its reply read whole (it ends with the last chunk); then a plain request
        // with a stream pipelined behind it; then a header trickled in and never finished.
        let mut raw = Vec::new();
        s.write_all((chat_head(KEY, streamed.len(), "") + &streamed).as_bytes())
            .expect("write");
        raw.extend(read_until_last_chunk(&mut s));
        let both = chat_head(KEY, plain.len(), "")
            + &plain
            + &chat_head(KEY, streamed.len(), "x-mock-delay-ms: 20\r\n")
            + &streamed;
        s.write_all(both.as_bytes()).expect("write");
        raw.extend(read_until_last_chunk(&mut s));
        let cut_after = trickle_until_cut(&mut s, b"GET /v1/models HTTP/1.1\r\nX-Slow: ");
        (String::from_utf8_lossy(&raw).into_owned(), cut_after)
    });
    let got = replies(&raw);
    assert_eq!(got.len(), 3, "{raw}");
    for r in &got {
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    assert!(got[0].contains("data: [DONE]"), "{}", got[0]);
    assert!(got[1].contains("\"chat.completion\""), "{}", got[1]);
    assert!(got[2].contains("data: [DONE]"), "{}", got[2]);
    assert!(cut_after >= Duration::from_millis(450), "{cut_after:?}");
    assert!(cut_after < Duration::from_secs(3), "{cut_after:?}");
    assert_recorded(
        &g,
        &[
            (got[0], 200, true),
            (got[1], 200, false),
            (got[2], 200, true),
        ],
    )
    .await;
}

/// A stream the upstream refuses is answered from the task it went on in at its admission,
/// with its record, and its connection then carries the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_is_answered_and_its_connection_serves_the_next_request() {
    let g = start();
    let (refused, next) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        let (plain, streamed) = (chat_json(false), chat_json(true));
        let head = chat_head(KEY, streamed.len(), "x-mock-status: 400\r\n");
        s.write_all((head + &streamed).as_bytes()).expect("write");
        let refused = read_one_reply(&mut s);
        s.write_all((chat_head(KEY, plain.len(), "") + &plain).as_bytes())
            .expect("write");
        (refused, read_one_reply(&mut s))
    });
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    assert!(refused.contains("\"error\""), "{refused}");
    assert!(next.starts_with("HTTP/1.1 200"), "{next}");
    assert!(next.contains("\"chat.completion\""), "{next}");
    assert_recorded(&g, &[(&refused, 400, true), (&next, 200, false)]).await;
}

/// Each reply's record (found by the reply's request id) says its status and whether it was a
/// stream.
async fn assert_recorded(g: &Gateway, expected: &[(&str, u64, bool)]) {
    for (reply, status, stream) in expected {
        let record = await_record(g, &request_id_in(reply)).await;
        assert_eq!(record["status"], *status, "{record}");
        assert_eq!(record["stream"], *stream, "{record}");
    }
}

/// What a stream's reply sends up to its first event (its header included).
fn read_until_an_event(s: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("data: ") {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    raw
}

/// A request sent on a connection while a stream's reply is still going out on it (read by the
/// stream's watch for the client's close, which then stops) is answered after the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_while_a_stream_goes_out_is_answered_after_it() {
    let g = start();
    let raw = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        let streamed = chat_json(true);
        // Events 100 ms apart.
        let head = chat_head(KEY, streamed.len(), "x-mock-delay-ms: 100\r\n");
        s.write_all((head + &streamed).as_bytes()).expect("write");
        let mut raw = read_until_an_event(&mut s);
        assert!(
            !String::from_utf8_lossy(&raw).contains("[DONE]"),
            "the stream is not still going: {}",
            String::from_utf8_lossy(&raw)
        );
        s.write_all(
            format!(
                "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
                 Connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .expect("write");
        let _ = s.read_to_end(&mut raw);
        String::from_utf8_lossy(&raw).into_owned()
    });
    let got = replies(&raw);
    assert_eq!(got.len(), 2, "{raw}");
    assert!(got[0].starts_with("HTTP/1.1 200"), "{}", got[0]);
    assert!(
        got[0].ends_with("data: [DONE]\n\n\r\n0\r\n\r\n"),
        "{}",
        got[0]
    );
    assert!(got[0].contains("\"finish_reason\":\"stop\""), "{}", got[0]);
    assert!(got[1].starts_with("HTTP/1.1 200"), "{}", got[1]);
    assert!(got[1].contains("\"list\""), "{}", got[1]);
    assert_recorded(&g, &[(got[0], 200, true), (got[1], 200, false)]).await;
}

/// A client that sent a stream with a request pipelined behind it and then hangs up while the
/// stream is quiet is noticed at once (499), not only at the stream's next event. (With
/// `on_client_gone = "cancel"`, so the stream ends when it is noticed; by default it is read
/// on for its usage: `tests/client_gone.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_after_pipelining_behind_a_stream_is_noticed_while_it_is_quiet() {
    let g = start_with(Setup {
        server_extra: "on_client_gone = \"cancel\"".into(),
        ..Setup::default()
    });
    let (id, closed) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        let streamed = chat_json(true);
        // Events 3 s apart; the next request in the same write.
        let head = chat_head(KEY, streamed.len(), "x-mock-delay-ms: 3000\r\n");
        let models =
            format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n");
        s.write_all((head + &streamed + &models).as_bytes())
            .expect("write");
        let raw = read_until_an_event(&mut s);
        let id = request_id_in(&String::from_utf8_lossy(&raw));
        drop(s);
        (id, Instant::now())
    });
    let r = await_record(&g, &id).await;
    assert_eq!(r["status"], 499, "{r}");
    assert!(
        closed.elapsed() < Duration::from_millis(2500),
        "noticed after {:?}",
        closed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_request_split_at_its_header_end_outlasts_the_header_deadline() {
    let g = start_with(Setup {
        server_extra: "client_header_timeout_ms = 500".into(),
        ..Setup::default()
    });
    let (first, raw, took) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        let plain = chat_json(false);
        let streamed = chat_json(true);
        // The second request's header arrives with the first request, all but its last byte;
        // the rest comes after the first reply. Its stream then takes about 1.6 s.
        let second = chat_head(
            KEY,
            streamed.len(),
            "Connection: close\r\nx-mock-delay-ms: 200\r\n",
        );
        let (second_head, last) = second.split_at(second.len() - 1);
        s.write_all((chat_head(KEY, plain.len(), "") + &plain + second_head).as_bytes())
            .expect("write");
        let first = read_one_reply(&mut s);
        let started = Instant::now();
        s.write_all((last.to_string() + &streamed).as_bytes())
            .expect("write");
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        (
            first,
            String::from_utf8_lossy(&raw).into_owned(),
            started.elapsed(),
        )
    });
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.contains("data: [DONE]"), "cut: {raw}");
    assert!(took >= Duration::from_millis(1_000), "{took:?}");
    let record = await_record(&g, &request_id_in(&raw)).await;
    assert_eq!(record["status"], 200, "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_of_a_pipelined_request_is_cut_at_its_deadline() {
    let g = start_with(Setup {
        server_extra: "client_header_timeout_ms = 500".into(),
        ..Setup::default()
    });
    let (first, cut_after) = tokio::task::block_in_place(|| {
        let mut s = blocking_connect(&g.main, Duration::from_secs(10));
        let plain = chat_json(false);
        let started = Instant::now();
        let both = chat_head(KEY, plain.len(), "")
            + &plain
            + "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ";
        s.write_all(both.as_bytes()).expect("write");
        let first = read_one_reply(&mut s);
        trickle_until_cut(&mut s, b"a");
        (first, started.elapsed())
    });
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(cut_after >= Duration::from_millis(450), "{cut_after:?}");
    assert!(cut_after < Duration::from_secs(3), "{cut_after:?}");
}

/// A client that stops reading holds nothing for good: a stream's write (and with it the
/// upstream connection) or a CSV export's ends after `client_send_timeout_ms` without progress,
/// recorded as the client's (499).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_after_the_send_timeout() {
    let g = start_with(Setup {
        server_extra: "client_send_timeout_ms = 500".into(),
        ..Setup::default()
    });
    // A stream far larger than the sockets between hold.
    let body = chat_json(true);
    let head = chat_head(KEY, body.len(), "x-mock-chunks: 200000\r\n") + &body;
    let (_stream_reader, stream_id) =
        tokio::task::block_in_place(|| stop_reading_after_the_header(&g.main, &head));
    // An export of 60,000 records (about 8 MB).
    seed_records(&g, 60_000, 60_000);
    let csv =
        format!("GET /api/usage.csv HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    let (_csv_reader, csv_id) =
        tokio::task::block_in_place(|| stop_reading_after_the_header(&g.direct, &csv));
    for (id, endpoint) in [(&stream_id, "chat"), (&csv_id, "usage")] {
        // The stream's output is estimated (about 30,000 tokens, slow in a debug build).
        let r = await_record_within(&client(), &g.direct, id, Duration::from_secs(60)).await;
        assert_eq!(
            (r["status"].as_u64(), r["endpoint"].as_str()),
            (Some(499), Some(endpoint)),
            "{r}"
        );
        let took = r["latency_ms"].as_u64().unwrap_or(0);
        assert!((500..10_000).contains(&took), "{r}");
    }
}
