//! A stream's client connection once the stream left Pingora's request (the proxy's
//! `detach`): the
//! connection itself, with what is left to know of the request (its header in one piece of
//! bytes, its method, target and version). Pingora's session, with its 4 KiB header buffer
//! (the header's values are slices of it), the request's header maps and its own state, is
//! given up as the stream is admitted: a stream may wait seconds for its first token, and
//! thousands of them may wait at once.
//!
//! Everything the client gets from then on is written here as Pingora's session writes it:
//! the gateway's own error replies, the reply's header (with `Date` and `Connection`), and its
//! body, chunked, by its length, or to the close. The connection is handed on as the session
//! would hand it on (kept alive or closed, with the bytes of the client's next requests).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use pingora_core::apps::{HttpPersistentSettings, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::http::v1::client::http_req_header_to_wire;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora_error::{Error, ErrorType};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_timeout::fast_timeout::fast_timeout;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::Downstream;
use super::writer::{BodyWriter, Framing, Parts};

/// The most bytes of the client's next requests read at once while a stream is on (the watch
/// for the client's close then stops, as Pingora's session stops once its own watch read a
/// next request's bytes).
const NEXT_READ: usize = 1024;

/// The most header fields of a request read again for a try (Pingora's own limit).
const MAX_HEADERS: usize = 256;

/// The longest a closing connection's shutdown may take (a TLS close_notify to a client that
/// reads nothing).
const SHUTDOWN_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A detached stream's client connection.
pub struct Conn {
    stream: Stream,
    /// Bytes of the client's next requests: read with this request, or while its reply went.
    next: BytesMut,
    /// The watch read bytes of a next request: it reads no more.
    stashed: bool,
    /// How the connection goes on after the reply; `None`: it closes.
    keep: Option<HttpPersistentSettings>,
    /// The request's header (its fields in their case; a repeated field's lines together, as
    /// the session's header map held them), for the tries; empty once the reply is on its way.
    head: Bytes,
    /// The request's method, target and version (for the record and the reply's framing).
    asked: http::request::Parts,
    /// How the reply's body goes, once its header is out.
    body: Option<BodyWriter>,
}

impl Conn {
    /// The connection of an admitted stream's session, whose request body was read whole; a
    /// session whose connection cannot be had gives a connection that is gone (the stream
    /// then ends as the client's, 499).
    pub async fn of(session: Box<ServerSession>) -> Conn {
        let settings = HttpPersistentSettings::for_session(&session);
        let req = session.req_header();
        let (mut asked, ()) = http::Request::new(()).into_parts();
        asked.method = req.method.clone();
        asked.uri = req.uri.clone();
        asked.version = req.version;
        // To its own size (it is written with room for 512 bytes or more): thousands of
        // streams may wait at once.
        let head =
            http_req_header_to_wire(req).map_or_else(Bytes::new, |w| Bytes::from(w.to_vec()));
        let mut conn = Conn::gone(head, asked);
        let ServerSession::H1(h1) = *session else {
            return conn;
        };
        // Pipelining on: the session gives up a connection kept alive whatever came after the
        // request (else it would close it when bytes of a next request came with this one).
        if !h1.will_keepalive() || !h1.pipelining_enabled() {
            conn.stream = h1.into_inner();
            return conn;
        }
        if let Ok(Some(reusable)) = h1.reuse().await {
            let (stream, next) = reusable.into_parts();
            conn.stream = stream;
            // Copied: the session's bytes are part of its request's buffer.
            conn.next = next.map(|n| BytesMut::from(&n[..])).unwrap_or_default();
            conn.keep = Some(settings);
        }
        conn
    }

    /// A connection that is gone: it reads a close, and every write fails.
    fn gone(head: Bytes, asked: http::request::Parts) -> Conn {
        Conn {
            stream: Box::new(Gone::default()),
            next: BytesMut::new(),
            stashed: false,
            keep: None,
            head,
            asked,
            body: None,
        }
    }

    /// Writes a reply's header as Pingora's session does: with `Date`, and `Connection` as the
    /// connection goes on (a body with neither a length nor chunks ends with the close). A
    /// header with a body of known length is not flushed: the body's first write takes it.
    async fn header(&mut self, mut h: Box<ResponseHeader>) -> pingora_error::Result<()> {
        if self.body.is_some() {
            tracing::warn!("a second reply header for one request: not written");
            return Ok(());
        }
        // (An invalid length was refused as the upstream's reply was read.)
        let head = self.asked.method == http::Method::HEAD;
        let framing = Framing::of_reply(head, h.status.as_u16(), &h.headers);
        if framing == Framing::Close {
            self.keep = None;
        }
        h.insert_header(
            http::header::DATE,
            pingora_core::protocols::http::date::get_cached_date(),
        )?;
        let connection = if self.keep.is_some() {
            "keep-alive"
        } else {
            "close"
        };
        h.insert_header(http::header::CONNECTION, connection)?;
        let wire = response_wire(&h)?;
        let flush = !matches!(framing, Framing::Length(n) if n > 0);
        let written = async {
            self.stream.write_all(&wire).await?;
            if flush {
                self.stream.flush().await?;
            }
            Ok::<(), io::Error>(())
        };
        written.await.map_err(|e| {
            Error::because(ErrorType::WriteError, "writing the reply's header", e).into_down()
        })?;
        self.body = Some(BodyWriter::new(framing));
        Ok(())
    }

    /// Writes a piece of the body, and ends it when `done` (the last chunk, for a chunked
    /// one): a chunk's size line, the piece and its end go as one vectored write, then a
    /// flush. The piece is not copied here: the connection (`listener::Deadlined`) gathers a
    /// small chunk's parts into one write, and a large one goes out as it is. A body of known
    /// length gets no more than its length, and one that ends short of it is cut (`Err`, and
    /// the connection is not kept), as Pingora's session does.
    async fn write(&mut self, piece: Option<Bytes>, done: bool) -> pingora_error::Result<()> {
        let Some(body) = &mut self.body else {
            return Err(
                Error::explain(ErrorType::WriteError, "a reply's body before its header")
                    .into_down(),
            );
        };
        let (parts, short) = body.piece(piece, done);
        if short {
            self.keep = None;
        }
        if let Some(parts) = parts {
            self.send(&parts).await?;
        }
        if short {
            return Err(Error::explain(
                ErrorType::WriteError,
                "the reply's body ended short of its length",
            )
            .into_down());
        }
        Ok(())
    }

    /// Sends a piece of the body's parts (a chunk's size line, the piece, its end) as one
    /// vectored write, and flushes them.
    async fn send(&mut self, parts: &Parts) -> pingora_error::Result<()> {
        let mut slices = [
            io::IoSlice::new(parts.size_line()),
            io::IoSlice::new(parts.data.as_deref().unwrap_or_default()),
            io::IoSlice::new(parts.end),
        ];
        let written = async {
            let mut left = &mut slices[..];
            while left.iter().any(|p| !p.is_empty()) {
                let n = self.stream.write_vectored(left).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                io::IoSlice::advance_slices(&mut left, n);
            }
            self.stream.flush().await
        };
        written.await.map_err(|e| {
            Error::because(ErrorType::WriteError, "writing the reply's body", e).into_down()
        })
    }

    /// Lets go of the request's header: its reply is on its way, and no try is made from here.
    pub fn forget_request(&mut self) {
        self.head = Bytes::new();
    }

    /// Resolves when the client closes the connection (or it fails). Bytes of a next request
    /// are kept for it, and the watch then stops.
    fn watch(&mut self) -> impl Future<Output = ()> + Send + '_ {
        std::future::poll_fn(move |cx| {
            if self.stashed {
                return Poll::Pending;
            }
            // The buffer lives for this poll only: a stream waiting holds none.
            let mut buf = [0u8; NEXT_READ];
            let mut read = ReadBuf::new(&mut buf);
            match Pin::new(&mut self.stream).poll_read(cx, &mut read) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(())) if !read.filled().is_empty() => {
                    self.next.extend_from_slice(read.filled());
                    self.stashed = true;
                    Poll::Pending
                }
                // Gone: the connection is not kept for another request.
                Poll::Ready(_) => {
                    self.keep = None;
                    Poll::Ready(())
                }
            }
        })
    }

    /// The reply is over: the connection, when it is kept alive, with the bytes of its next
    /// requests; else it is shut down.
    pub async fn finish(mut self) -> Option<ReusedHttpStream> {
        let Some(mut settings) = self.keep else {
            fast_timeout(SHUTDOWN_LIMIT, Shutdown::shutdown(&mut *self.stream))
                .await
                .ok();
            return None;
        };
        if !self.next.is_empty() {
            settings.set_pipelined_prefix(self.next);
        }
        Some(ReusedHttpStream::new(self.stream, Some(settings)))
    }
}

impl Downstream for Conn {
    fn asked(&self) -> &http::request::Parts {
        &self.asked
    }

    /// The client's request header, read again from its bytes (for a try).
    fn request(&self) -> pingora_error::Result<RequestHeader> {
        parse_request(&self.head)
    }

    fn write_header(
        &mut self,
        h: Box<ResponseHeader>,
        _end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_ {
        self.header(h)
    }

    fn write_body(
        &mut self,
        body: Option<Bytes>,
        end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_ {
        self.write(body, end)
    }

    /// The body was read whole before the stream was admitted.
    fn drain_small_body(&mut self) -> impl Future<Output = ()> + Send + '_ {
        std::future::ready(())
    }

    fn gone(&mut self) -> impl Future<Output = ()> + Send + '_ {
        self.watch()
    }
}

/// A reply's header as it goes on the wire (as Pingora's session writes it).
fn response_wire(h: &ResponseHeader) -> pingora_error::Result<Vec<u8>> {
    let version = match h.version {
        http::Version::HTTP_10 => "HTTP/1.0 ",
        http::Version::HTTP_11 => "HTTP/1.1 ",
        _ => {
            return Err(Error::explain(
                ErrorType::InvalidHTTPHeader,
                "a reply's version an HTTP/1 client cannot read",
            ));
        }
    };
    let mut buf = BytesMut::with_capacity(512);
    buf.put_slice(version.as_bytes());
    buf.put_slice(h.status.as_str().as_bytes());
    buf.put_u8(b' ');
    if let Some(reason) = h.get_reason_phrase() {
        buf.put_slice(reason.as_bytes());
    }
    buf.put_slice(b"\r\n");
    h.header_to_h1_wire(&mut buf);
    buf.put_slice(b"\r\n");
    Ok(buf.to_vec())
}

/// A request header from its bytes as `http_req_header_to_wire` wrote them, its fields in
/// their case and order.
fn parse_request(wire: &[u8]) -> pingora_error::Result<RequestHeader> {
    let bad = || Error::explain(ErrorType::InvalidHTTPHeader, "the request's header");
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut fields);
    if !matches!(parsed.parse(wire), Ok(httparse::Status::Complete(_))) {
        return Err(bad());
    }
    let (Some(method), Some(path), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Err(bad());
    };
    let mut req = RequestHeader::build(method, path.as_bytes(), Some(parsed.headers.len()))?;
    req.set_version(if minor == 0 {
        http::Version::HTTP_10
    } else {
        http::Version::HTTP_11
    });
    for field in parsed.headers.iter() {
        req.append_header(field.name.to_string(), field.value)?;
    }
    Ok(req)
}

/// The client session left in Pingora's request once its stream went on elsewhere, and the
/// connection of a stream's `Conn` that has none (taken, or lost): no socket. It reads what it
/// was given (`reading`: a header to check, `listener::unreadable`), then a close.
#[derive(Debug, Default)]
pub struct Gone {
    left: Bytes,
}

impl Gone {
    pub fn reading(bytes: Bytes) -> Gone {
        Gone { left: bytes }
    }
}

impl AsyncRead for Gone {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self.left.len().min(buf.remaining());
        let read = self.left.split_to(n);
        buf.put_slice(&read);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Gone {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::NotConnected.into()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[async_trait]
impl Shutdown for Gone {
    async fn shutdown(&mut self) {}
}

impl UniqueID for Gone {
    fn id(&self) -> UniqueIDType {
        -1
    }
}

impl Ssl for Gone {}

impl GetTimingDigest for Gone {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        Vec::new()
    }
}

impl GetProxyDigest for Gone {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        None
    }
}

impl GetSocketDigest for Gone {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        None
    }

    fn set_socket_digest(&mut self, _digest: SocketDigest) {}
}

#[async_trait]
impl Peek for Gone {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_header_read_again_from_its_bytes_is_the_same() -> pingora_error::Result<()> {
        let mut req = RequestHeader::build("POST", b"/v1/chat/completions?a=%20b", None)?;
        req.append_header("Host".to_string(), "gw")?;
        req.append_header("X-Custom-Case".to_string(), "one")?;
        req.append_header("accept".to_string(), "text/event-stream")?;
        req.append_header("X-Custom-Case".to_string(), "two")?;
        let wire = http_req_header_to_wire(&req).expect("writable");
        let again = parse_request(&wire)?;
        assert_eq!(again.method, req.method);
        assert_eq!(again.raw_path(), req.raw_path());
        assert_eq!(again.version, http::Version::HTTP_11);
        assert_eq!(http_req_header_to_wire(&again).expect("writable"), wire);
        assert!(parse_request(b"POST / HTTP/1.1\r\nHost: x\r\n").is_err());
        Ok(())
    }

    #[test]
    fn a_reply_header_goes_as_pingora_writes_it() -> pingora_error::Result<()> {
        let mut h = ResponseHeader::build(200, None)?;
        h.append_header("Content-Type", "text/event-stream")?;
        let wire = response_wire(&h)?;
        assert_eq!(
            wire,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n".to_vec()
        );
        Ok(())
    }

    /// A connection over one end of a socket pair, kept alive (as a session on HTTP/1.1
    /// would be), and the other end.
    fn pair() -> (Conn, tokio::net::UnixStream) {
        let (ours, theirs) = tokio::net::UnixStream::pair().expect("socket pair");
        let (asked, ()) = http::Request::new(()).into_parts();
        let mut conn = Conn::gone(Bytes::new(), asked);
        conn.stream = Box::new(pingora_core::protocols::l4::stream::Stream::from(ours));
        let mut session = ServerSession::new_http1(Box::new(Gone::default()));
        session.set_keepalive(Some(60));
        conn.keep = Some(HttpPersistentSettings::for_session(&session));
        (conn, theirs)
    }

    async fn read_all(mut theirs: tokio::net::UnixStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).await.expect("read");
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn a_body_of_known_length_gets_no_more_and_one_that_ends_short_is_cut()
    -> pingora_error::Result<()> {
        let (mut conn, theirs) = pair();
        let mut h = ResponseHeader::build(200, None)?;
        h.insert_header("content-length", "5")?;
        conn.header(Box::new(h.clone())).await?;
        // A second header is not written.
        conn.header(Box::new(h.clone())).await?;
        conn.write(Some(Bytes::from_static(b"hello world")), false)
            .await?;
        conn.write(Some(Bytes::from_static(b"!")), true).await?;
        assert!(conn.keep.is_some());
        drop(conn);
        let text = read_all(theirs).await;
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("\r\nConnection: keep-alive\r\n"), "{text}");
        assert!(text.contains("\r\nDate: "), "{text}");
        assert!(text.ends_with("\r\n\r\nhello"), "{text}");
        assert_eq!(text.matches("HTTP/1.1").count(), 1, "{text}");

        let (mut conn, theirs) = pair();
        h.insert_header("content-length", "10")?;
        conn.header(Box::new(h)).await?;
        let short = conn.write(Some(Bytes::from_static(b"hello")), true).await;
        assert!(short.is_err());
        assert!(
            conn.keep.is_none(),
            "a connection whose reply was cut is not kept"
        );
        drop(conn);
        assert!(read_all(theirs).await.ends_with("\r\n\r\nhello"));
        Ok(())
    }

    #[tokio::test]
    async fn a_body_without_a_length_goes_chunked_or_to_the_close() -> pingora_error::Result<()> {
        let (mut conn, theirs) = pair();
        let mut h = ResponseHeader::build(200, None)?;
        h.insert_header("transfer-encoding", "chunked")?;
        conn.header(Box::new(h)).await?;
        conn.write(Some(Bytes::from_static(b"data: 1\n\n")), false)
            .await?;
        conn.write(None, true).await?;
        assert!(conn.keep.is_some());
        drop(conn);
        let text = read_all(theirs).await;
        assert!(
            text.ends_with("\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n"),
            "{text:?}"
        );

        let (mut conn, theirs) = pair();
        conn.header(Box::new(ResponseHeader::build(200, None)?))
            .await?;
        conn.write(Some(Bytes::from_static(b"data: 1\n\n")), true)
            .await?;
        assert!(
            conn.keep.is_none(),
            "a body to the close ends the connection"
        );
        assert!(conn.finish().await.is_none());
        let text = read_all(theirs).await;
        assert!(text.contains("\r\nConnection: close\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\ndata: 1\n\n"), "{text:?}");
        Ok(())
    }

    #[tokio::test]
    async fn a_client_seen_gone_is_not_kept_for_another_request() {
        let (mut conn, theirs) = pair();
        drop(theirs);
        conn.watch().await;
        assert!(conn.keep.is_none());
        assert!(conn.finish().await.is_none());
        // Bytes of a next request are kept for it, and the connection with them.
        let (mut conn, mut theirs) = pair();
        tokio::io::AsyncWriteExt::write_all(&mut theirs, b"GET / HTTP/1.1\r\n")
            .await
            .expect("write");
        let watched = tokio::time::timeout(std::time::Duration::from_millis(200), conn.watch());
        assert!(
            watched.await.is_err(),
            "a next request's bytes are not a close"
        );
        assert_eq!(&conn.next[..], b"GET / HTTP/1.1\r\n");
        assert!(conn.finish().await.is_some());
    }
}
