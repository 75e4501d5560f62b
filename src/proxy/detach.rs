//! A stream's reply goes on in a task of its own. Pingora holds a request's whole state in one
//! future (`process_new_http`, 15 KB, with the proxy's own stages inside it) until the request
//! ends, and a stream may last minutes while its events trickle. Once a stream's success header
//! is in, what its relay needs (the client's HTTP/1 session, the upstream connection, the
//! request's `Ctx`) moves to a task of its own and Pingora's request ends at once: what it
//! held is freed while the stream runs. The task relays the reply (`forward::relay`, as a reply
//! that stays inline is relayed), notes the try's end, writes the record (`proxy::end`, as
//! Pingora's `logging` does for every other request) and, when the connection can carry
//! another request, serves the connection's next requests from there (`listener::resume`).
//!
//! What is left in Pingora's request is a session on `Gone` (no socket: it reads nothing,
//! writes nowhere, and is never kept alive) and a `Ctx` marked `detached`, whose end writes no
//! record. HTTP/2 streams stay inline: Pingora's HTTP/2 connection owns their sessions.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use pingora_core::apps::{HttpPersistentSettings, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Gateway;
use super::ctx::Ctx;
use super::forward::{self, TryEnd, Upstreamed};
use crate::route::Route;
use crate::route::balance::InFlight;
use crate::state::Shared;
use crate::upstream::Connections;

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
    resp: ResponseHeader,
    end: TryEnd,
) {
    inflight.keep();
    let gone = Box::new(ServerSession::new_http1(Box::new(Gone)));
    let relay = Relay {
        shared: gw.shared.clone(),
        connections: gw.connections.clone(),
        downstream: std::mem::replace(&mut session.downstream_session, gone),
        counted: Counted {
            route,
            upstream: ctx.upstream,
        },
        ctx: ctx.hand_off(),
        upstream,
        resp,
        end,
    };
    // The relay's state is boxed, and freed before the connection's next requests are served
    // from this task: tokio moves a task's future whole as it spawns it (and writes its stage
    // whole as it ends), so the task's own future stays small.
    tokio::spawn(async move {
        let reused = Box::pin(relay.run()).await;
        if let Some(reused) = reused {
            crate::listener::resume(reused).await;
        }
    });
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
    resp: ResponseHeader,
    end: TryEnd,
}

impl Relay {
    /// Relays the reply, notes the try, writes the record; the connection, when it can carry
    /// another request.
    async fn run(self) -> Option<ReusedHttpStream> {
        let Relay {
            shared,
            connections,
            mut downstream,
            counted,
            mut ctx,
            upstream,
            resp,
            end,
        } = self;
        let pool = &counted.route.pool;
        let sent = match pool.upstreams.get(counted.upstream) {
            Some(up) => {
                let sent = forward::relay(
                    &connections,
                    &mut downstream,
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
        super::end(
            &shared,
            downstream.req_header(),
            failed.as_deref(),
            &mut ctx,
        )
        .await;
        drop(ctx);
        if failed.is_some() {
            return None;
        }
        let settings = HttpPersistentSettings::for_session(&downstream);
        let reusable = downstream.finish().await.ok().flatten()?;
        Some(ReusedHttpStream::from_reusable_stream(reusable, settings))
    }
}

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
