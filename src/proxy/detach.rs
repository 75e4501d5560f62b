//! A stream goes on in tasks of its own. Pingora holds a request's whole state in one future
//! (`process_new_http`, 15 KB, with the proxy's own stages inside it) until the request ends;
//! a model server may take seconds to its first token, and a stream may last minutes while its
//! events trickle.
//!
//! Once admitted, a stream to an HTTP/1 client moves (its client's session and its `Ctx`) to
//! a task that makes its tries (`forward::run`, as Pingora's request would: [`spawn_early`]),
//! and Pingora's request ends at once. The task gives the client's session up for the
//! connection under it ([`Conn`]): the session's header buffer and maps are not held while
//! the stream waits for its first token. Should the stream end there (an error answered, the
//! client gone, no upstream), that task ends the request as Pingora would have.
//!
//! Once a stream's success header is in, what its relay needs (the client's connection, the
//! upstream connection, the request's `Ctx`) moves to a task of its own: what the tries held
//! is freed while the stream runs. The task relays the reply (`relay`, as a reply that stays
//! inline is relayed), notes the try's end, writes the record
//! (`proxy::end`, as Pingora's `logging` does for every other request) and, when the
//! connection can carry another request, serves the connection's next requests from there
//! (`http1::listener::resume`).
//!
//! What is left in Pingora's request is a session on `Gone` (no socket: it reads nothing,
//! writes nowhere, and is never kept alive) and a `Ctx` marked `detached`, whose end writes no
//! record. HTTP/2 streams stay inline: Pingora's HTTP/2 connection owns their sessions.

use std::future::Future;
use std::sync::Arc;

use pingora_core::apps::ReusedHttpStream;
use pingora_core::protocols::http::ServerSession;
use pingora_proxy::Session;

use super::Gateway;
use super::Shared;
use super::ctx::Ctx;
use super::forward::{self, Forwarded, Reply};
use crate::http1::conn::{Conn, Gone};
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
    let gone = Box::new(ServerSession::new_http1(Box::new(Gone::default())));
    std::mem::replace(&mut session.downstream_session, gone)
}

/// Runs a request's part in a task of its own, then, when its connection can carry another
/// request, serves the connection's next requests from there (`http1::listener::resume`). The part
/// and the next requests are each boxed, the part before the spawn, and the part is freed
/// before the next requests are served: tokio moves a task's future whole as it spawns it (and
/// writes its stage whole as it ends), and a task's cell is as large as its future for the
/// task's whole life. A future captured whole (the part, unboxed) is kept in it besides what
/// its awaits hold, a stream's 2.4 KB for as long as the stream lasts.
fn go_on(part: impl Future<Output = Option<ReusedHttpStream>> + Send + 'static) {
    let part = Box::pin(part);
    // Owned by the request: it holds the in-flight guard and writes the record.
    #[allow(clippy::disallowed_methods)]
    tokio::spawn(async move {
        if let Some(reused) = part.await {
            Box::pin(crate::http1::listener::resume(reused)).await;
        }
    });
}

/// What an early-detached stream's task owns until its reply's header is in.
struct Exchange {
    gw: Gateway,
    downstream: Box<ServerSession>,
    ctx: Box<Ctx>,
}

impl Exchange {
    /// Gives the client's session up for its connection ([`Conn`]), makes the tries; unless
    /// the relay went on in a task of its own, ends the request as Pingora ends one its filter
    /// answered (`logging`, then the connection kept alive) or failed (`fail_to_proxy`, the
    /// error line, `logging`).
    async fn run(self) -> Option<ReusedHttpStream> {
        let Exchange {
            gw,
            downstream,
            mut ctx,
        } = self;
        let mut conn = Box::pin(Conn::of(downstream)).await;
        let sent = match forward::run(&gw, &mut conn, &mut ctx).await {
            Forwarded::Reply(reply) => {
                // The relay's task has the reply, the connection and the record.
                spawn(&gw, conn, ctx, reply);
                return None;
            }
            Forwarded::Done(sent) => sent,
        };
        // Boxed, as the relay's are: the record would make the task's future as large for
        // all its tries.
        Box::pin(end_here(&gw.shared, conn, ctx, sent)).await
    }
}

/// Ends the request in its own task as Pingora ends one (`finish`: the failure answered, its
/// line, the record), then hands the connection on when it can carry another request (kept
/// alive, not after a failure).
async fn end_here(
    shared: &Shared,
    mut conn: Conn,
    mut ctx: Box<Ctx>,
    sent: pingora_error::Result<()>,
) -> Option<ReusedHttpStream> {
    let failed = sent.err();
    super::finish(shared, &mut conn, failed.as_deref(), &mut ctx).await;
    drop(ctx);
    if failed.is_some() {
        return None;
    }
    Box::pin(conn.finish()).await
}

/// Moves the request's reply, its client's connection and its state to a task of their own:
/// what the tries held is freed while the reply runs. The request's header goes: no try is
/// made from here on.
fn spawn(gw: &Gateway, mut conn: Conn, ctx: Box<Ctx>, reply: Reply) {
    conn.forget_request();
    let relay = Relay {
        shared: gw.shared.clone(),
        connections: gw.connections.clone(),
        conn,
        ctx,
        reply,
    };
    go_on(relay.run());
}

/// What a stream's own task owns.
struct Relay {
    shared: Arc<Shared>,
    connections: Arc<Connections>,
    conn: Conn,
    ctx: Box<Ctx>,
    reply: Reply,
}

impl Relay {
    /// Relays the reply, notes the try, writes the record; the connection, when it can carry
    /// another request.
    async fn run(self) -> Option<ReusedHttpStream> {
        let Relay {
            shared,
            connections,
            mut conn,
            mut ctx,
            reply,
        } = self;
        let sent = super::relay_reply(&connections, &mut conn, &mut ctx, reply).await;
        Box::pin(end_here(&shared, conn, ctx, sent)).await
    }
}
