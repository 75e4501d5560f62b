//! A stream goes on in tasks of its own. Pingora holds a request's whole state in one future
//! (`process_new_http`, 15 KB, with the proxy's own stages inside it) until the request ends;
//! a model server may take seconds to its first token, and a stream may last minutes while its
//! events trickle.
//!
//! Once admitted, a stream to an HTTP/1 client moves (its client's session and its `Ctx`) to
//! a task that makes its tries (`forward::run`, as Pingora's request would: [`spawn_early`]),
//! and Pingora's request ends at once. Should the stream end there (an error answered, the
//! client gone, no upstream), that task ends the request as Pingora would have.
//!
//! Once a stream's success header is in, what its relay needs (the client's HTTP/1 session,
//! the upstream connection, the request's `Ctx`) moves to a task of its own: what the tries
//! held is freed while the stream runs. The task relays the reply (`forward::relay_body`, as
//! a reply that stays inline is relayed), notes the try's end, writes the record
//! (`proxy::end`, as Pingora's `logging` does for every other request) and, when the
//! connection can carry another request, serves the connection's next requests from there
//! (`listener::resume`).
//!
//! Once the task has written the reply's header, a body that goes chunked (a stream to an
//! HTTP/1.1 client) is written on the connection itself ([`Wire`]): the client's session, with
//! the request's header and buffers and the reply's header maps, is given up for the rest of
//! the stream, and the connection is handed on as the session would hand it on (kept alive or
//! closed, with the bytes of the client's next requests).
//!
//! What is left in Pingora's request is a session on `Gone` (no socket: it reads nothing,
//! writes nowhere, and is never kept alive) and a `Ctx` marked `detached`, whose end writes no
//! record. HTTP/2 streams stay inline: Pingora's HTTP/2 connection owns their sessions.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};

use async_trait::async_trait;
use pingora_core::apps::{HttpPersistentSettings, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora_http::ResponseHeader;
use pingora_proxy::{ProxyHttp, Session};
use pingora_timeout::fast_timeout::fast_timeout;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::Gateway;
use super::ctx::Ctx;
use super::forward::{self, Downstream, TryEnd, Upstreamed};
use crate::route::balance::InFlight;
use crate::route::{Pool, Route, Upstream};
use crate::state::Shared;
use crate::upstream::Connections;

/// Whether an admitted request goes on in a task of its own from here on, before its
/// upstream exchange: a stream to an HTTP/1 client. A model server may take seconds to its
/// first token, and Pingora's request state (its `process_new_http` future, 15 KB written
/// whole, the connection's task, the request filter's future) would be held all that time.
pub(super) fn early(session: &Session, ctx: &Ctx) -> bool {
    ctx.stream && ctx.route.is_some() && matches!(session.as_downstream(), ServerSession::H1(_))
}

/// Moves an admitted stream (its client's session and its state) to a task of its own, which
/// makes its tries (`forward::run`, as Pingora's request would) and ends the request as
/// Pingora would have; once the reply's header is in, the relay goes on in a task of its own
/// again ([`spawn`]), which lets go of what the tries held.
pub(super) fn spawn_early(gw: &Gateway, session: &mut Session, ctx: &mut Ctx) {
    let exchange = Exchange {
        gw: Gateway {
            shared: gw.shared.clone(),
            listener: gw.listener,
            connections: gw.connections.clone(),
        },
        downstream: take_client(session),
        ctx: ctx.hand_off(),
    };
    go_on(exchange.run());
}

/// The client's session, taken out of Pingora's request: what is left there is a session on
/// `Gone`.
fn take_client(session: &mut Session) -> Box<ServerSession> {
    let gone = Box::new(ServerSession::new_http1(Box::new(Gone)));
    std::mem::replace(&mut session.downstream_session, gone)
}

/// Runs a request's part in a task of its own, then, when its connection can carry another
/// request, serves the connection's next requests from there (`listener::resume`). The part
/// and the next requests are each boxed, the part before the spawn, and the part is freed
/// before the next requests are served: tokio moves a task's future whole as it spawns it (and
/// writes its stage whole as it ends), and a task's cell is as large as its future for the
/// task's whole life. A future captured whole (the part, unboxed) is kept in it besides what
/// its awaits hold, a stream's 2.4 KB for as long as the stream lasts.
fn go_on(part: impl Future<Output = Option<ReusedHttpStream>> + Send + 'static) {
    let part = Box::pin(part);
    tokio::spawn(async move {
        if let Some(reused) = part.await {
            Box::pin(crate::listener::resume(reused)).await;
        }
    });
}

/// Ends a client's session whose request is over: its connection, when it can carry another
/// request (as Pingora hands it on).
async fn hand_on(session: Box<ServerSession>) -> Option<ReusedHttpStream> {
    let settings = HttpPersistentSettings::for_session(&session);
    let reusable = session.finish().await.ok().flatten()?;
    Some(ReusedHttpStream::from_reusable_stream(reusable, settings))
}

/// What an early-detached stream's task owns until its reply's header is in.
struct Exchange {
    gw: Gateway,
    downstream: Box<ServerSession>,
    ctx: Box<Ctx>,
}

impl Exchange {
    /// Makes the tries; unless the relay went on in a task of its own, ends the request as
    /// Pingora ends one its filter answered (`logging`, then the connection kept alive) or
    /// failed (`fail_to_proxy`, the error line, `logging`).
    async fn run(self) -> Option<ReusedHttpStream> {
        let Exchange {
            gw,
            downstream,
            mut ctx,
        } = self;
        let mut session = Session::new_h1(Box::new(Gone));
        session.downstream_session = downstream;
        let sent = forward::run(&gw, &mut session, &mut ctx).await;
        if ctx.detached {
            // The relay's task has the reply, the connection and the record.
            return None;
        }
        match sent {
            // Boxed, as the relay's are: the hand-over of the connection (Pingora's `finish`,
            // 3.8 KB) and the record would make the task's future as large for all its tries.
            Ok(()) => {
                Box::pin(super::end(&gw.shared, session.req_header(), None, &mut ctx)).await;
                drop(ctx);
                Box::pin(hand_on(session.downstream_session)).await
            }
            Err(e) => {
                let failed = gw.fail_to_proxy(&mut session, &e, &mut ctx).await;
                if !super::quiet_failure(&ctx, &e) {
                    tracing::error!(
                        request_id = %ctx.request_id,
                        "the stream failed: {e}, status: {}",
                        failed.error_code
                    );
                }
                Box::pin(super::end(
                    &gw.shared,
                    session.req_header(),
                    Some(&e),
                    &mut ctx,
                ))
                .await;
                None
            }
        }
    }
}

/// The route of a reply that can go on in its own task: a stream's, to an HTTP/1 client.
pub fn route(session: &Session, ctx: &Ctx) -> Option<Arc<Route>> {
    let h1 = matches!(session.as_downstream(), ServerSession::H1(_));
    // (Checked before the route is cloned: every plain reply asks.)
    (ctx.stream && h1).then(|| ctx.route.clone()).flatten()
}

/// Moves the request's reply, its client's session and its state to a task of their own,
/// with the upstream's count of requests in flight (`inflight`, the try's), which ends with
/// the reply.
pub(super) fn spawn(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut Ctx,
    (route, inflight): (Arc<Route>, InFlight<'_>),
    upstream: Upstreamed,
    resp: Box<ResponseHeader>,
    end: TryEnd,
) {
    inflight.keep();
    let relay = Relay {
        shared: gw.shared.clone(),
        connections: gw.connections.clone(),
        downstream: take_client(session),
        counted: Counted {
            route,
            upstream: ctx.upstream,
        },
        ctx: ctx.hand_off(),
        upstream,
        resp,
        end,
    };
    go_on(relay.run());
}

/// A request counted in flight on an upstream of a route, until this drops.
struct Counted {
    route: Arc<Route>,
    upstream: usize,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(up) = self.route.pool.upstreams.get(self.upstream) {
            up.health.end_kept();
        }
    }
}

/// What a stream's own task owns.
struct Relay {
    shared: Arc<Shared>,
    connections: Arc<Connections>,
    downstream: Box<ServerSession>,
    counted: Counted,
    ctx: Box<Ctx>,
    upstream: Upstreamed,
    resp: Box<ResponseHeader>,
    end: TryEnd,
}

impl Relay {
    /// Relays the reply, notes the try, writes the record; the connection, when it can carry
    /// another request.
    async fn run(self) -> Option<ReusedHttpStream> {
        let Relay {
            shared,
            connections,
            downstream,
            counted,
            mut ctx,
            upstream,
            resp,
            end,
        } = self;
        // What the record needs of the request's header, kept apart: the header itself goes
        // with the client's session once the reply's header is out.
        let (mut asked, ()) = http::Request::new(()).into_parts();
        asked.method = downstream.req_header().method.clone();
        asked.uri = downstream.req_header().uri.clone();
        let mut client = Client::Session(downstream);
        let pool = &counted.route.pool;
        let sent = match pool.upstreams.get(counted.upstream) {
            Some(up) => {
                let sent = relay(
                    &connections,
                    &mut client,
                    &mut ctx,
                    pool,
                    up,
                    upstream,
                    resp,
                );
                let sent = sent.await;
                end.note(&mut ctx, pool, up);
                sent
            }
            None => Err(pingora_error::Error::explain(
                pingora_error::ErrorType::InternalError,
                "the reply's upstream is not in its pool",
            )),
        };
        drop(counted);
        // As Pingora ends a request whose filter failed (`fail_to_proxy`, its error line,
        // `logging`), or one that was answered (`logging`, then the connection kept alive).
        let failed = sent.err();
        if let Some(e) = &failed {
            ctx.outcome = super::outcome_after_reply(&ctx, e);
            if !super::quiet_failure(&ctx, e) {
                tracing::error!(
                    request_id = %ctx.request_id,
                    "the stream failed: {e}, status: {}",
                    ctx.outcome.status()
                );
            }
        }
        Box::pin(super::end(&shared, &asked, failed.as_deref(), &mut ctx)).await;
        drop(ctx);
        if failed.is_some() {
            return None;
        }
        Box::pin(client.finish()).await
    }
}

/// Writes the reply's header through the client's session, then relays the body: on the
/// connection itself ([`Wire`]) when the body goes chunked, else through the session.
///
/// Every step but the relay on the connection is boxed: a task's future is as large as its
/// largest step, and stays that large for the whole stream (Pingora's session writes and its
/// hand-over of the connection would make it a few KB larger).
async fn relay(
    connections: &Connections,
    client: &mut Client,
    ctx: &mut Ctx,
    pool: &Pool,
    up: &Upstream,
    upstream: Upstreamed,
    resp: Box<ResponseHeader>,
) -> pingora_error::Result<()> {
    if let Client::Session(session) = client {
        let wire = Wire::fits(session, &resp);
        Box::pin(forward::write_header(ctx, session, resp)).await?;
        if wire {
            Box::pin(client.wire()).await?;
        }
    }
    match client {
        Client::Wire(wire) => forward::relay_body(connections, wire, ctx, pool, up, upstream).await,
        Client::Session(session) => {
            let relay = forward::relay_body(connections, &mut **session, ctx, pool, up, upstream);
            Box::pin(relay).await
        }
        Client::Lost => Err(lost()),
    }
}

/// A detached stream's client: its HTTP/1 session, or, once the header is out, the connection
/// itself.
enum Client {
    Session(Box<ServerSession>),
    Wire(Wire),
    /// Lost as the session was given up (its connection had failed).
    Lost,
}

impl Client {
    /// Gives the session up for the connection under it, the reply's header written.
    async fn wire(&mut self) -> pingora_error::Result<()> {
        let Client::Session(session) = std::mem::replace(self, Client::Lost) else {
            return Ok(());
        };
        *self = Client::Wire(Wire::of(session).await?);
        Ok(())
    }

    /// The reply is over: the connection, when it can carry another request.
    async fn finish(self) -> Option<ReusedHttpStream> {
        match self {
            Client::Session(session) => hand_on(session).await,
            Client::Wire(wire) => wire.finish().await,
            Client::Lost => None,
        }
    }
}

impl Downstream for Wire {
    fn body(
        &mut self,
        piece: Option<Bytes>,
        done: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_ {
        self.write(piece, done)
    }

    fn gone(&mut self) -> impl Future<Output = ()> + Send + '_ {
        self.watch()
    }
}

fn lost() -> Box<pingora_error::Error> {
    pingora_error::Error::explain(
        pingora_error::ErrorType::ConnectionClosed,
        "the client's connection was lost",
    )
    .into_down()
}

/// The most bytes of the client's next requests read at once while a reply goes out on
/// [`Wire`] (the watch for the client's close then stops, as Pingora's session stops once its
/// own watch read a next request's bytes).
const NEXT_READ: usize = 1024;

/// A stream's client connection once the reply's header is out, its body going chunked: the
/// connection itself, written as Pingora's session writes a chunked body. What the session
/// held for the request (its header and its buffer, the reply's header maps) is freed for the
/// rest of the stream.
struct Wire {
    stream: Stream,
    /// Bytes of the client's next requests: read with this request, or while its reply went.
    next: BytesMut,
    /// The watch read bytes of a next request: it reads no more.
    stashed: bool,
    /// How the connection goes on after the reply; `None`: it closes.
    keep: Option<HttpPersistentSettings>,
}

impl Wire {
    /// Whether the reply, written to this session, goes chunked on a connection that the
    /// session can give up: what [`Wire`] writes. (Else it stays with the session.)
    fn fits(session: &ServerSession, resp: &ResponseHeader) -> bool {
        let ServerSession::H1(h1) = session else {
            return false;
        };
        let req = session.req_header();
        let bodiless = matches!(resp.status.as_u16(), 100..=199 | 204 | 304)
            || req.method == http::Method::HEAD;
        // Pipelining on: the session gives up a connection kept alive whatever came after the
        // request (else it would close it when bytes of a next request came with this one).
        !bodiless
            && h1.pipelining_enabled()
            && !resp.headers.contains_key(http::header::UPGRADE)
            && crate::respond::chunked(&resp.headers)
    }

    /// The connection of a session whose reply's header was written.
    async fn of(session: Box<ServerSession>) -> pingora_error::Result<Wire> {
        let settings = HttpPersistentSettings::for_session(&session);
        let ServerSession::H1(h1) = *session else {
            return Err(lost());
        };
        if !h1.will_keepalive() {
            return Ok(Wire {
                stream: h1.into_inner(),
                next: BytesMut::new(),
                stashed: false,
                keep: None,
            });
        }
        let reusable = h1.reuse().await.map_err(|e| e.into_down())?;
        let (stream, next) = reusable.ok_or_else(lost)?.into_parts();
        Ok(Wire {
            stream,
            // Copied: the session's bytes are part of its request's buffer.
            next: next.map(|n| BytesMut::from(&n[..])).unwrap_or_default(),
            stashed: false,
            keep: Some(settings),
        })
    }

    /// Writes a piece of the body as a chunk, and the last chunk when `done`: the chunk's size
    /// line, the piece and its end go as one vectored write, then a flush. The piece is not
    /// copied here: the connection (`listener::Deadlined`) gathers a small chunk's parts into
    /// one write, and a large one goes out as it is.
    async fn write(&mut self, piece: Option<Bytes>, done: bool) -> pingora_error::Result<()> {
        let piece = piece.filter(|p| !p.is_empty());
        if piece.is_none() && !done {
            return Ok(());
        }
        // The size line, on the stack: at most 16 hex digits and its CRLF.
        let mut line = [0u8; 18];
        let size = match &piece {
            Some(p) => {
                let mut rest = &mut line[..];
                let _ = std::io::Write::write_fmt(&mut rest, format_args!("{:X}\r\n", p.len()));
                18 - rest.len()
            }
            None => 0,
        };
        let end: &[u8] = match (&piece, done) {
            (Some(_), true) => b"\r\n0\r\n\r\n",
            (Some(_), false) => b"\r\n",
            (None, _) => b"0\r\n\r\n",
        };
        let mut parts = [
            io::IoSlice::new(&line[..size]),
            io::IoSlice::new(piece.as_deref().unwrap_or_default()),
            io::IoSlice::new(end),
        ];
        let written = async {
            let mut left = &mut parts[..];
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
            pingora_error::Error::because(
                pingora_error::ErrorType::WriteError,
                "writing the reply's body",
                e,
            )
            .into_down()
        })
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
                Poll::Ready(_) => Poll::Ready(()),
            }
        })
    }

    /// The reply is over (its last chunk written): the connection, when it is kept alive,
    /// with the bytes of its next requests; else it is shut down.
    async fn finish(mut self) -> Option<ReusedHttpStream> {
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

/// The longest a closing connection's shutdown may take (a TLS close_notify to a client that
/// reads nothing).
const SHUTDOWN_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The client session left in Pingora's request once its stream went on elsewhere: no socket.
#[derive(Debug)]
struct Gone;

impl AsyncRead for Gone {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
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
