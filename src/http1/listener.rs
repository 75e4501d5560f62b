//! The listeners' connection layer: a deadline for each request's header. Pingora bounds each
//! read of a request header (60 s) but not the whole header, so a client trickling one byte at
//! a time could hold a connection forever. `HeaderDeadline` wraps the proxy app: each
//! connection's stream is wrapped once in `Deadlined`, which ends the connection when a
//! request's header is not complete within `client_header_timeout_ms` of its first byte (a new
//! connection must send that byte within the same time). The header is complete when the
//! proxy has it (`header_arrived`, the first thing its request filter does). Idle time between
//! requests is the keep-alive timeout's business, and the body's is `client_body_timeout_ms`'s.
//!
//! HTTP/1.1 pipelining is on: a request sent before the reply to the one before it is read
//! with that reply's idle read and answered after it, in order (RFC 9112 §9.3), rather than
//! dropped with the connection. Its header may arrive whole with the previous request's bytes,
//! or in part, which is why the deadline ends with the proxy's word and not with bytes seen.
//!
//! A connection's first request header is read here before Pingora's session is made
//! (`preread_header`, up to 4 KiB) and checked by Pingora's own request reader, on those bytes
//! alone (`unreadable`): a header Pingora would refuse with its bare `400` gets, in its place,
//! the reply the gateway gives for it (`Hooks::unparseable`, the contract's JSON 400 with an
//! `x-request-id`), and the connection closes. A later request on a kept-alive connection, or
//! a first header over 4 KiB, is read by Pingora alone, which answers its bare `400`.
//!
//! This layer knows nothing of the gateway above it but the two calls it is given (`Hooks`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use pingora_core::apps::{HttpServerApp, ReusedHttpStream, ServerApp};
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::tls::{SslDigest, TlsRef};
use pingora_core::protocols::{
    ALPN, GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    Stream, TimingDigest, UniqueID, UniqueIDType,
};
use pingora_core::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A proxy app whose connections each get a header deadline.
pub struct HeaderDeadline<A> {
    pub inner: Arc<A>,
    pub limit: Duration,
    /// The listener's name, for the replies given here (unparseable requests).
    pub listener: &'static str,
    pub hooks: Hooks,
}

/// What the layer above does at this layer's points.
#[derive(Clone)]
pub struct Hooks {
    /// A request begins on this thread (before Pingora's request is made).
    pub request_started: fn(),
    /// The whole reply (header and body, `Connection: close`) to a connection's first request
    /// that Pingora's reader refuses, on the listener named.
    pub unparseable: std::sync::Arc<dyn Fn(&'static str) -> Vec<u8> + Send + Sync>,
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for HeaderDeadline<A> {
    /// The connection goes on in a task of its own, and Pingora's task for it ends at once:
    /// that task is 8.8 KB, written whole as Pingora spawns it (it holds a TLS handshake's
    /// state, TLS or not), and it would be held for as long as the connection is (an idle
    /// client, a header on its way, a kept-alive connection between requests). This one holds
    /// what the connection's requests need (about 2 KB).
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let app = self.clone();
        let shutdown = shutdown.clone();
        // Owned by the listener: the connection watches the shutdown.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move { app.connection(stream, &shutdown).await });
        None
    }

    async fn cleanup(&self) {
        self.inner.http_cleanup().await
    }
}

impl<A: HttpServerApp + Send + Sync + 'static> HeaderDeadline<A> {
    /// Serves a connection: HTTP/2 by Pingora's own loop, HTTP/1 by `requests`.
    async fn connection(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) {
        let options = self.inner.server_options();
        let h2c =
            options.is_some_and(|o| o.h2c || o.force_custom) && stream.get_ssl_digest().is_none();
        let mut stream = stream;
        if h2c || stream.selected_alpn_proto().is_some_and(|p| p != ALPN::H1) {
            // HTTP/2 (TLS listeners, by ALPN): its frames are not HTTP/1 text, so neither the
            // header watch nor the pre-read applies. Its connection preface must come
            // within the header deadline (Pingora's h2 server waits for it for good, so idle
            // connections could take every file descriptor); after it, an idle connection is
            // closed by Pingora's h2 idle timeout (`keepalive_timeout_ms`).
            let mut first = [0u8; 1];
            match tokio::time::timeout(self.limit, stream.try_peek(&mut first)).await {
                Ok(Ok(_)) => {}
                _ => return,
            }
            let mut deadlined = Deadlined::new(stream, self.limit);
            deadlined.preface_left = H2_PREFACE_LEN;
            // (Its loop gives no connection back: HTTP/2 and HTTP/1 alike end it.)
            ServerApp::process_new(&self.inner, Box::new(deadlined), shutdown).await;
            return;
        }
        // Wait for the request's first byte before the proxy sees the connection: Pingora
        // drops a connection whose request has not arrived when a shutdown or upgrade begins,
        // so one accepted just before SIGQUIT would be closed unanswered. With a byte in hand,
        // its request is read first. A client that sends nothing within
        // `client_header_timeout_ms` is closed, as before.
        let mut first = [0u8; 1];
        match tokio::time::timeout(self.limit, stream.try_peek(&mut first)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        // The connection's requests, one after the other, as Pingora's own HTTP/1 loop runs
        // them (`impl ServerApp for HttpServerApp`), with the deadline restarted for each:
        // it starts at the next request's first byte. Run here rather than in that loop, the
        // connection's future also holds no HTTP/2 handshake state (3.8 KB a connection).
        let mut deadlined = Deadlined::new(stream, self.limit);
        // A reply that goes on in a task of its own (the proxy's `detach`) takes the connection
        // with it, and serves its next requests from there (`resume`).
        deadlined.resume = Some((self.clone(), shutdown.clone()));
        // The first request's header is read before Pingora's request is made: that request
        // (15.3 KB, and a 4 KiB header buffer) would be held for as long as the header takes
        // to come, up to `client_header_timeout_ms`.
        deadlined.preread_header().await;
        if unreadable(&deadlined.replay).await {
            let reply = (self.hooks.unparseable)(self.listener);
            deadlined.refuse(&reply).await;
            return;
        }
        let mut session = ServerSession::new_http1(Box::new(deadlined));
        session.set_pipelining_enabled(true);
        session.set_keepalive(if *shutdown.borrow() { None } else { Some(60) });
        session.set_keepalive_reuses_remaining(options.and_then(|o| o.keepalive_request_limit));
        (self.hooks.request_started)();
        let reused = self.inner.process_new_http(session, shutdown).await;
        self.requests(reused, shutdown).await;
    }

    /// The connection's next requests, one after the other, for as long as it is kept alive.
    async fn requests(&self, mut reused: Option<ReusedHttpStream>, shutdown: &ShutdownWatch) {
        while let Some((stream, settings)) = reused.map(ReusedHttpStream::consume) {
            let Ok(mut deadlined) = stream.into_any().downcast::<Deadlined>() else {
                return;
            };
            deadlined.next_request();
            let mut session = ServerSession::new_http1(deadlined);
            if let Some(settings) = settings {
                settings.apply_to_session(&mut session);
            }
            (self.hooks.request_started)();
            reused = self.inner.process_new_http(session, shutdown).await;
        }
    }
}

/// A listener's loop over a connection's requests, as a reply's own task calls it.
trait Requests: Send + Sync {
    fn serve(
        self: Arc<Self>,
        reused: ReusedHttpStream,
        shutdown: ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

impl<A: HttpServerApp + Send + Sync + 'static> Requests for HeaderDeadline<A> {
    fn serve(
        self: Arc<Self>,
        reused: ReusedHttpStream,
        shutdown: ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move { self.requests(Some(reused), &shutdown).await })
    }
}

/// Serves a connection's next requests after a reply that went on in its own task
/// (the proxy's `detach`), which ended with the connection fit for another request: the loop of
/// `HeaderDeadline` goes on from there, in that task.
pub async fn resume(reused: ReusedHttpStream) {
    let (stream, settings) = reused.consume();
    let resume = stream
        .as_any()
        .downcast_ref::<Deadlined>()
        .and_then(|d| d.resume.clone());
    if let Some((app, shutdown)) = resume {
        app.serve(ReusedHttpStream::new(stream, settings), shutdown)
            .await;
    }
}

/// A connection's stream with a deadline on the current request's header.
pub struct Deadlined {
    inner: Stream,
    limit: Duration,
    /// While `armed`, the header must be complete when this fires (one timer per connection,
    /// reset for each request).
    timer: Pin<Box<tokio::time::Sleep>>,
    armed: bool,
    /// Between requests: the timer starts with the next byte.
    awaiting_first_byte: bool,
    /// The proxy has the current request's header (`header_arrived`): the timer is spent.
    header_in: AtomicBool,
    /// HTTP/2: bytes of the connection preface still to come before the deadline is spent.
    preface_left: usize,
    /// The loop over the connection's requests, for `resume`.
    resume: Option<(Arc<dyn Requests>, ShutdownWatch)>,
    /// Small writes gathered for one write to the client (`poll_gather`), and how much of
    /// them went out.
    gathered: Vec<u8>,
    drained: usize,
    /// Bytes read before Pingora's session was made (`preread_header`), read again by it
    /// first.
    replay: BytesMut,
}

impl std::fmt::Debug for Deadlined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadlined")
            .field("inner", &self.inner)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// The most of a connection's first request header read before Pingora's session is made
/// (`Deadlined::preread_header`): a larger header goes on in Pingora's read.
const PREREAD_MAX: usize = 4096;

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`, the start of every HTTP/2 connection.
const H2_PREFACE_LEN: usize = 24;

/// Whether a request header, read whole (or as far as it came), is one Pingora's own reader
/// refuses: read by a session of Pingora's over those bytes alone. A header still incomplete
/// there reads as an end of the connection, not a refusal.
async fn unreadable(header: &[u8]) -> bool {
    if header.is_empty() {
        return false;
    }
    let bytes = bytes::Bytes::copy_from_slice(header);
    let mut session = ServerSession::new_http1(Box::new(super::conn::Gone::reading(bytes)));
    matches!(
        session.read_request().await,
        Err(e) if e.etype() == &pingora_error::ErrorType::InvalidHTTPHeader
    )
}

impl Deadlined {
    /// Sends a refusal written whole (a request this layer answers itself) and closes the
    /// connection, within the header deadline.
    async fn refuse(&mut self, reply: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let sent = async {
            self.inner.write_all(reply).await?;
            self.inner.flush().await?;
            AsyncWriteExt::shutdown(&mut self.inner).await?;
            Ok::<(), io::Error>(())
        };
        let _ = tokio::time::timeout(self.limit, sent).await;
    }
}

impl Deadlined {
    fn new(inner: Stream, limit: Duration) -> Deadlined {
        Deadlined {
            inner,
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
            armed: true,
            awaiting_first_byte: false,
            header_in: AtomicBool::new(false),
            preface_left: 0,
            resume: None,
            gathered: Vec::new(),
            drained: 0,
            replay: BytesMut::new(),
        }
    }

    /// Reads the connection's first request header (until httparse has it whole or finds it
    /// is not one, or `PREREAD_MAX` bytes of it) into `replay`, under the header deadline,
    /// before Pingora's session reads it from there. An end of the connection, an error or
    /// the deadline ends the wait, and Pingora's read meets it in turn.
    async fn preread_header(&mut self) {
        std::future::poll_fn(|cx| {
            loop {
                // Whole, or not a request header as httparse reads one (Pingora answers it at
                // once), or long: Pingora's read goes on from here.
                if !self.replay.is_empty() {
                    let mut headers = [httparse::EMPTY_HEADER; 64];
                    let parsed = httparse::Request::new(&mut headers).parse(&self.replay);
                    if !matches!(parsed, Ok(httparse::Status::Partial)) {
                        return Poll::Ready(());
                    }
                }
                if self.replay.len() >= PREREAD_MAX {
                    return Poll::Ready(());
                }
                // The buffer lives for this poll only: a connection waiting holds what came.
                let mut buf = [0u8; 1024];
                let mut read = ReadBuf::new(&mut buf);
                match self.poll_read_socket(cx, &mut read) {
                    Poll::Ready(Ok(())) if !read.filled().is_empty() => {
                        self.replay.extend_from_slice(read.filled());
                    }
                    Poll::Ready(_) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await
    }

    fn next_request(&mut self) {
        self.armed = false;
        self.awaiting_first_byte = true;
        *self.header_in.get_mut() = false;
    }

    /// Starts the next request's timer on its first byte read; an HTTP/2 connection's deadline
    /// is spent once its preface is in.
    fn saw(&mut self, bytes: &[u8]) {
        if self.preface_left > 0 {
            self.preface_left = self.preface_left.saturating_sub(bytes.len());
            if self.preface_left == 0 {
                *self.header_in.get_mut() = true;
            }
        }
        if self.awaiting_first_byte && !bytes.is_empty() {
            self.awaiting_first_byte = false;
            let at = tokio::time::Instant::now() + self.limit;
            self.timer.as_mut().reset(at);
            self.armed = true;
        }
    }

    /// Whether the header deadline has passed with the header still out.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.armed || self.header_in.load(Ordering::Relaxed) {
            self.armed = false;
            return false;
        }
        self.timer.as_mut().poll(cx).is_ready()
    }
}

/// The request's header is complete and parsed: its connection's header deadline is spent.
/// The proxy calls this first thing for every request (an HTTP/2 stream has no deadline).
pub fn header_arrived(session: &pingora_proxy::Session) {
    let deadlined = session
        .as_downstream()
        .stream()
        .and_then(|s| s.as_any().downcast_ref::<Deadlined>());
    if let Some(d) = deadlined {
        d.header_in.store(true, Ordering::Relaxed);
    }
}

impl AsyncRead for Deadlined {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.replay.is_empty() {
            let n = self.replay.len().min(buf.remaining());
            let replayed = self.replay.split_to(n);
            buf.put_slice(&replayed);
            // The allocation goes once all of it is read again.
            if self.replay.is_empty() {
                self.replay = BytesMut::new();
            }
            // Bytes of a next request among them (pipelined) start its deadline.
            self.saw(&replayed);
            return Poll::Ready(Ok(()));
        }
        self.poll_read_socket(cx, buf)
    }
}

impl Deadlined {
    /// A read from the connection itself, under the header deadline.
    fn poll_read_socket(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                self.saw(&buf.filled()[before..]);
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if self.expired(cx) {
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the request header did not arrive within client_header_timeout_ms",
                    )))
                } else {
                    Poll::Pending
                }
            }
            other => other,
        }
    }
}

impl AsyncWrite for Deadlined {
    /// One slice: the vectored path's (the gathering).
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_gather(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }
}

/// What was gathered goes out as the connection is dropped, if it can without waiting: a
/// reply cut by an error is dropped unflushed, and its client gets what was written of it
/// (its header, and a body shorter than its length says: a cut it can see).
impl Drop for Deadlined {
    fn drop(&mut self) {
        if self.drained < self.gathered.len() {
            let drain = std::future::poll_fn(|cx| self.poll_drain(cx));
            let _ = futures_util::FutureExt::now_or_never(drain);
        }
    }
}

/// The most bytes gathered for one write to the client: Pingora's own write buffer's size.
const GATHER_MAX: usize = 1460;

impl Deadlined {
    /// Writes as a `BufWriter` of `GATHER_MAX` would: small writes (a reply's header, then a
    /// small body) are gathered and go out in one write at the flush; a large one goes
    /// straight out. The buffer is taken for the gathering only and freed once it is out, so
    /// a connection that waits (a quiet stream between its events, a kept-alive connection)
    /// holds none: the listeners give their connections no write buffer of Pingora's (1.4 KB
    /// each, for the connection's whole life).
    fn poll_gather(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).sum::<usize>();
        if self.gathered.len() + len > GATHER_MAX {
            std::task::ready!(self.poll_drain(cx))?;
        }
        if len >= GATHER_MAX {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        }
        if self.gathered.capacity() == 0 {
            self.gathered.reserve_exact(GATHER_MAX);
        }
        for b in bufs {
            self.gathered.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    /// Writes out what was gathered, then frees its buffer.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.drained < self.gathered.len() {
            let rest = &self.gathered[self.drained..];
            match std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, rest)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.drained += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        if self.gathered.capacity() > 0 {
            self.gathered = Vec::new();
        }
        self.drained = 0;
        Poll::Ready(Ok(()))
    }
}

#[async_trait]
impl Shutdown for Deadlined {
    async fn shutdown(&mut self) {
        let _ = std::future::poll_fn(|cx| self.poll_drain(cx)).await;
        self.inner.shutdown().await
    }
}

impl UniqueID for Deadlined {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Deadlined {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for Deadlined {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for Deadlined {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for Deadlined {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for Deadlined {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
