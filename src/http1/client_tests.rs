//! The upstream HTTP/1.1 exchange against a real socket.

use super::*;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A connection whose upstream writes `parts` (each in a write of its own, then closes
/// when `close`), and the request it got.
async fn conn(parts: &[&[u8]], close: bool) -> (Conn, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let parts: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
    // A test's own server.
    #[allow(clippy::disallowed_methods)]
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut got = vec![0u8; 4096];
        let n = s.read(&mut got).await.expect("read");
        got.truncate(n);
        for p in parts {
            s.write_all(&p).await.expect("write");
            s.flush().await.expect("flush");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if !close {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        got
    });
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let stream: Stream = Box::new(pingora_core::protocols::l4::stream::Stream::from(tcp));
    let peer = HttpPeer::new(addr, false, String::new());
    (Conn::new(stream, &peer), server)
}

async fn exchange(conn: &mut Conn, method: &str) -> pingora_error::Result<Vec<u8>> {
    let mut req = RequestHeader::build(method, b"/v1/x", None).expect("req");
    req.insert_header("host", "x").expect("host");
    req.insert_header("content-length", "2").expect("cl");
    conn.send(&Request::of(&req)?, b"{}").await?;
    loop {
        conn.read_response_header(None).await?;
        let s = conn.response_header().map_or(0, |h| h.status.as_u16());
        if !(100..200).contains(&s) {
            break;
        }
    }
    let mut body = Vec::new();
    while let Some(piece) = conn.read_response_body().await? {
        body.extend_from_slice(&piece);
    }
    Ok(body)
}

#[tokio::test]
async fn a_chunked_reply_split_anywhere_is_read_whole_and_the_connection_kept() {
    let reply: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n";
    for split in 1..reply.len() {
        let (mut c, server) = conn(&[&reply[..split], &reply[split..]], false).await;
        let body = exchange(&mut c, "POST").await.expect("exchange");
        assert_eq!(body, b"hello, world", "split at {split}");
        assert!(c.response_done());
        assert!(c.into_stream().is_ok(), "split at {split}");
        server.abort();
    }
}

#[tokio::test]
async fn the_request_goes_in_one_write_and_lengths_close_and_bodiless_replies_end_right() {
    let reply: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n\
        HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc";
    let (mut c, server) = conn(&[reply], false).await;
    assert_eq!(exchange(&mut c, "POST").await.expect("length"), b"abc");
    assert!(c.into_stream().is_ok());
    let got = server.await.expect("server");
    assert!(got.starts_with(b"POST /v1/x HTTP/1.1\r\n"), "{got:?}");
    assert!(got.ends_with(b"\r\n\r\n{}"), "{got:?}");

    let (mut c, _s) = conn(&[b"HTTP/1.0 200 OK\r\n\r\nuntil the close"], true).await;
    assert_eq!(
        exchange(&mut c, "POST").await.expect("close"),
        b"until the close"
    );
    assert!(
        c.into_stream().is_err(),
        "a close-delimited reply's connection is done"
    );

    let (mut c, s) = conn(&[b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"], false).await;
    assert_eq!(exchange(&mut c, "HEAD").await.expect("head"), b"");
    assert!(c.into_stream().is_ok());
    s.abort();

    let (mut c, s) = conn(
        &[b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"],
        false,
    )
    .await;
    assert_eq!(exchange(&mut c, "POST").await.expect("204"), b"");
    assert!(c.into_stream().is_err(), "the upstream said close");
    s.abort();

    // More than the length: the connection is not reused.
    let (mut c, s) = conn(&[b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab"], false).await;
    assert_eq!(exchange(&mut c, "POST").await.expect("over"), b"a");
    assert!(c.into_stream().is_err());
    s.abort();
}

#[tokio::test]
async fn broken_replies_are_pingoras_errors() {
    let cases: [(&[u8], ErrorType); 6] = [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            ErrorType::ConnectionClosed,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            ErrorType::ConnectionClosed,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            INVALID_CHUNK,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiX\r\n",
            INVALID_CHUNK,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            ErrorType::InvalidHTTPHeader,
        ),
        (b"garbage\r\n\r\n", ErrorType::InvalidHTTPHeader),
    ];
    for (reply, etype) in cases {
        let (mut c, _s) = conn(&[reply], true).await;
        let e = exchange(&mut c, "POST").await.expect_err("broken");
        assert_eq!(e.etype(), &etype, "{e} for {}", reply.escape_ascii());
    }
    // Closed before any reply: a stale kept connection's mark.
    let (mut c, _s) = conn(&[], true).await;
    let e = exchange(&mut c, "POST").await.expect_err("closed");
    assert_eq!(e.etype(), &ErrorType::ConnectionClosed);
    assert!(matches!(e.retry, RetryType::ReusedOnly));
    assert!(
        e.context
            .as_ref()
            .is_some_and(|c| c.as_str().ends_with("bytes already read: 0")),
        "{e}"
    );
}

#[test]
fn chunk_sizes_are_hex_digits_then_extensions() {
    assert_eq!(chunk_size(b"1a").ok(), Some(26));
    assert_eq!(chunk_size(b"0000000000000010;name=v").ok(), Some(16));
    assert_eq!(chunk_size(b"5 ;x").ok(), Some(5));
    for bad in [&b""[..], b"+5", b" 5", b"5x", b"g", b"10000000000000000"] {
        assert!(chunk_size(bad).is_err(), "{}", bad.escape_ascii());
    }
}

#[tokio::test]
async fn a_header_and_its_body_in_one_read_keep_the_header_apart() {
    let (mut c, s) = conn(
        &[b"HTTP/1.1 200 OK\r\nX-Case: Kept\r\nX-Spaced : 1\r\nContent-Length: 2\r\n\r\nok"],
        false,
    )
    .await;
    let mut req = RequestHeader::build("GET", b"/", None).expect("req");
    req.insert_header("host", "x").expect("host");
    c.send(&Request::of(&req).expect("wire"), b"")
        .await
        .expect("send");
    c.read_response_header(None).await.expect("header");
    let header = c.take_response_header().expect("header");
    assert_eq!(header.status, 200);
    assert_eq!(
        header.headers.get("x-case").map(|v| v.as_bytes()),
        Some(&b"Kept"[..])
    );
    assert!(c.response_header().is_none());
    assert_eq!(
        c.read_response_body().await.expect("body").as_deref(),
        Some(&b"ok"[..])
    );
    assert_eq!(c.read_response_body().await.expect("end"), None);
    assert!(c.into_stream().is_ok());
    s.abort();
}

#[test]
fn a_reply_field_is_kept_by_its_name_in_any_case() {
    let keep = PassHeaders::parse(&[
        "OpenAI-Processing-MS".into(),
        "anthropic-ratelimit-*".into(),
    ])
    .expect("names");
    for name in [
        "content-type",
        "Content-Type",
        "TRANSFER-ENCODING",
        "connection",
        "X-Request-Id",
        "openai-processing-ms",
        "OpenAI-Processing-Ms",
        "anthropic-ratelimit-tokens-remaining",
        "Anthropic-RateLimit-Tokens-Remaining",
    ] {
        assert!(kept(&keep, name), "{name}");
    }
    let long = format!("anthropic-ratelimit-{}", "a".repeat(80));
    assert!(kept(&keep, &long.to_ascii_uppercase()));
    for name in [
        "set-cookie",
        "Set-Cookie",
        "openai-organization",
        "Server",
        "x-mock-peer",
    ] {
        assert!(!kept(&keep, name), "{name}");
    }
}
