//! A reply on its way to the client: its header written, its body relayed as it comes
//! (metered, under the idle and whole-request deadlines, the client's send timeout and the
//! shutdown's cut), or an upstream's error reply passed on in the contract's shape. The same
//! code relays a reply in Pingora's request and in a stream's own task (`detach`); what it
//! writes to is an `http1::Downstream`.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use pingora_error::{Error, ErrorType};
use pingora_http::ResponseHeader;
use pingora_timeout::fast_timeout::fast_timeout;

use super::ctx::Ctx;
use super::{reply, respond};
use crate::error::GatewayError;
use crate::http1::Downstream;
use crate::ops::lifecycle::{Lifecycle, cut};
use crate::route::{Pool, Route};
use crate::upstream;
use crate::upstream::Upstream;

/// The upstream connection a reply is read from (it knows where it goes back to).
pub(super) struct Upstreamed {
    pub(super) client: Box<upstream::Conn>,
}

impl Upstreamed {
    /// Returns the connection for reuse once its reply was read whole.
    async fn release(self, connections: &upstream::Connections) {
        connections.release(self.client).await;
    }
}

/// A request counted in flight on an upstream of a route until this drops (a reply relayed
/// after its try's own count ended).
pub(super) struct Counted {
    pub route: Arc<Route>,
    pub upstream: usize,
}

impl Counted {
    /// The reply's pool and upstream.
    pub(super) fn at(&self) -> Option<(&Pool, &Upstream)> {
        let pool = &self.route.pool;
        Some((pool, pool.upstreams.get(self.upstream)?))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(up) = self.route.pool.upstreams.get(self.upstream) {
            up.health.end_kept();
        }
    }
}

/// Writes a success's header, then relays its body.
pub(super) async fn reply<D: Downstream>(
    connections: &upstream::Connections,
    client: &mut D,
    ctx: &mut Ctx,
    (pool, up): (&Pool, &Upstream),
    upstream: Upstreamed,
    resp: Box<ResponseHeader>,
) -> pingora_error::Result<()> {
    // Boxed: a task's future is as large as its largest step, and stays that large for the
    // whole stream.
    Box::pin(write_header(ctx, client, resp)).await?;
    relay_body(connections, client, ctx, pool, up, upstream).await
}

/// Writes a success's header to the client (within the client's send timeout and the
/// shutdown's cut, as every write).
pub(super) async fn write_header(
    ctx: &mut Ctx,
    session: &mut impl Downstream,
    resp: Box<ResponseHeader>,
) -> pingora_error::Result<()> {
    let life = ctx.life.as_ref().map(|l| l.lifecycle());
    let bound = bound(ctx, life.as_deref());
    crate::http1::respond::header(session, &mut ctx.sent, bound, resp, false).await
}

/// Relays a success's body, its header written: as it comes, metered, under the idle and
/// whole-request deadlines. A failure cuts the reply (`Err`).
pub(super) async fn relay_body<D: Downstream>(
    connections: &upstream::Connections,
    session: &mut D,
    ctx: &mut Ctx,
    pool: &Pool,
    up: &Upstream,
    mut upstream: Upstreamed,
) -> pingora_error::Result<()> {
    let life = ctx.life.as_ref().map(|l| l.lifecycle());
    let limits = ReadLimits::of(ctx, pool);
    loop {
        let read = fast_timeout(limits.next(), upstream.client.read_response_body());
        // The upstream's piece first: when one is already there, the client's connection is not
        // polled (a read that would only say EAGAIN) and the shutdown signal not looked at; a
        // client that left is still noticed while the upstream is quiet, or by the next write.
        let chunk = tokio::select! {
            biased;
            r = read => Some(r),
            () = session.gone() => None,
            () = cut(life.as_deref()) => return Err(crate::http1::respond::shutdown_cut()),
        };
        let Some(chunk) = chunk else {
            let left = super::outcome::client_left();
            return finish_unsent(connections, ctx, pool, upstream, left).await;
        };
        let mut chunk = match chunk {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                pool.transport_failed(up);
                return Err(e.into_up());
            }
            Err(_) => {
                return Err(Error::explain(
                    ErrorType::ReadTimedout,
                    "the upstream's reply stalled past its deadline",
                )
                .into_up());
            }
        };
        let mut done = chunk.is_none() || upstream.client.response_done();
        reply::on_body(ctx, &mut chunk, done);
        // A stream cut by its budget ends here; the rest of the upstream's is not read.
        let cut = ctx.meter.cut_by_budget().is_some();
        done |= cut;
        // The pieces the upstream has already sent go out in one write (one send, one wake of
        // the client), as Pingora's own proxy loop does; a piece still on its way is not
        // waited for. Each is metered as it is taken.
        let mut failed = None;
        let mut out = Coalesced::new(chunk);
        while !done && out.len() < COALESCE_MAX {
            let Some(next) = upstream.client.read_response_body().now_or_never() else {
                break;
            };
            match next {
                Ok(mut c) => {
                    done = c.is_none() || upstream.client.response_done();
                    reply::on_body(ctx, &mut c, done);
                    done |= ctx.meter.cut_by_budget().is_some();
                    out.push(c);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let piece = out.take();
        if done && failed.is_none() {
            // The record goes to the journal before the reply's last byte goes to the client.
            super::record::preclose(ctx).await;
        }
        if piece.is_some() || done {
            let bound = bound(ctx, life.as_deref());
            let wrote =
                crate::http1::respond::body(session, &mut ctx.sent, bound, piece, done).await;
            match wrote {
                Ok(()) => {}
                // A client that left, or stopped reading: the rest is read for its usage.
                Err(e)
                    if !done && !crate::http1::respond::is_shutdown_cut(&e) && failed.is_none() =>
                {
                    return finish_unsent(connections, ctx, pool, upstream, e).await;
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = failed {
            pool.transport_failed(up);
            return Err(e.into_up());
        }
        if done {
            break;
        }
    }
    // A connection whose reply was left unread (a stream cut by its budget) is closed.
    if ctx.meter.cut_by_budget().is_none() {
        upstream.release(connections).await;
    }
    Ok(())
}

/// The client is gone (`left` says how) while the upstream still sends its reply. With
/// `on_client_gone = "finish"` the rest is read to its end, within the pool's deadlines and the
/// shutdown's cut (a stream within `request_timeout` from the client's leaving), metered and
/// not sent on, so the usage of the work the upstream did is
/// billed; with `"cancel"` the upstream's connection is dropped at once. Either way the
/// request ends as the client's (`left`).
pub(super) async fn finish_unsent(
    connections: &upstream::Connections,
    ctx: &mut Ctx,
    pool: &Pool,
    mut upstream: Upstreamed,
    left: Box<Error>,
) -> pingora_error::Result<()> {
    if !ctx.finish_when_gone {
        return Err(left);
    }
    let life = ctx.life.as_ref().map(|l| l.lifecycle());
    let mut limits = ReadLimits::of(ctx, pool);
    // Unsent, a stream is read within the pool's `request_timeout` from here: an upstream
    // that never ends is not read forever for nobody.
    limits
        .deadline
        .get_or_insert_with(|| Instant::now() + pool.cfg.request_timeout);
    loop {
        let read = fast_timeout(limits.next(), upstream.client.read_response_body());
        let chunk = tokio::select! {
            biased;
            r = read => r,
            () = cut(life.as_deref()) => return Err(left),
        };
        // An upstream that fails or stalls now ends it: what was metered counts.
        let Ok(Ok(mut chunk)) = chunk else {
            return Err(left);
        };
        let done = chunk.is_none() || upstream.client.response_done();
        reply::on_body(ctx, &mut chunk, done);
        if ctx.meter.cut_by_budget().is_some() {
            return Err(left);
        }
        if done {
            upstream.release(connections).await;
            return Err(left);
        }
    }
}

/// How long each read of a reply's body may wait: a stream may go quiet for `idle_timeout`
/// between events; a plain reply must be whole within `request_timeout` of the start.
struct ReadLimits {
    idle: std::time::Duration,
    deadline: Option<Instant>,
}

impl ReadLimits {
    fn of(ctx: &Ctx, pool: &Pool) -> ReadLimits {
        ReadLimits {
            idle: pool.cfg.idle_timeout,
            deadline: (!ctx.stream).then(|| ctx.started + pool.cfg.request_timeout),
        }
    }

    /// One clock read per piece: the idle limit, capped by what is left of the whole deadline.
    fn next(&self) -> std::time::Duration {
        self.deadline.map_or(self.idle, |d| {
            d.saturating_duration_since(Instant::now()).min(self.idle)
        })
    }
}

/// What bounds a write of the reply: a client that does not read holds it for at most
/// `client_send_timeout_ms` (then the reply ends as the client's: 499); the shutdown ends it
/// all the same. (`life` is the request's, held apart from `ctx` while the relay runs.)
fn bound<'a>(ctx: &Ctx, life: Option<&'a Lifecycle>) -> crate::http1::respond::Bound<'a> {
    crate::http1::respond::Bound {
        limit: ctx.send_timeout,
        life,
    }
}

/// The most reply bytes gathered into one write to the client.
const COALESCE_MAX: usize = 64 * 1024;

/// Reply pieces gathered for one write: the first kept as it is (no copy when it is alone).
struct Coalesced {
    first: Option<Bytes>,
    more: Option<BytesMut>,
}

impl Coalesced {
    fn new(first: Option<Bytes>) -> Coalesced {
        Coalesced { first, more: None }
    }

    fn len(&self) -> usize {
        match &self.more {
            Some(m) => m.len(),
            None => self.first.as_ref().map_or(0, Bytes::len),
        }
    }

    fn push(&mut self, piece: Option<Bytes>) {
        let Some(piece) = piece.filter(|p| !p.is_empty()) else {
            return;
        };
        if self.first.as_ref().is_none_or(Bytes::is_empty) && self.more.is_none() {
            self.first = Some(piece);
            return;
        }
        let more = self.more.get_or_insert_with(|| {
            let first = self.first.take().unwrap_or_default();
            let mut m = BytesMut::with_capacity(first.len() + piece.len() * 4);
            m.extend_from_slice(&first);
            m
        });
        more.extend_from_slice(&piece);
    }

    fn take(self) -> Option<Bytes> {
        match self.more {
            Some(m) => Some(m.freeze()),
            None => self.first,
        }
    }
}

/// The most of an upstream's error body the gateway reads to check its shape.
const ERROR_BODY_MAX: usize = 1024 * 1024;

/// An upstream's error reply (status kept): a JSON body passes unchanged; an empty or non-JSON
/// one is wrapped in the contract's error shape, so clients always get `{"error": …}`.
pub(super) async fn pass_error(
    connections: &upstream::Connections,
    session: &mut impl Downstream,
    ctx: &mut Ctx,
    pool: &Pool,
    mut upstream: Upstreamed,
    mut resp: Box<ResponseHeader>,
) -> pingora_error::Result<()> {
    let status = resp.status.as_u16();
    let mut body = Vec::new();
    let read = async {
        while let Some(chunk) = upstream.client.read_response_body().await? {
            body.extend_from_slice(&chunk);
            if body.len() > ERROR_BODY_MAX || upstream.client.response_done() {
                break;
            }
        }
        Ok::<(), Box<Error>>(())
    };
    // An upstream that sends its error header and then stalls holds the request for at most
    // the idle limit; the shutdown's cut ends the wait at once. No reply has begun then: the
    // client is told the gateway is shutting down, as while it waits for the header.
    let life = ctx.life.as_ref().map(|l| l.lifecycle());
    let read = tokio::select! {
        r = fast_timeout(pool.cfg.idle_timeout, read) => r,
        () = cut(life.as_deref()) => {
            let _ = respond::error(session, ctx, &GatewayError::ShuttingDown).await;
            return Ok(());
        }
    };
    let whole = match read {
        Ok(Ok(())) => body.len() <= ERROR_BODY_MAX,
        _ => false,
    };
    let json = !body.is_empty() && serde_json::from_slice::<serde_json::Value>(&body).is_ok();
    // The provider's error in the client's API, when the request was translated.
    let translated = ctx
        .translation
        .as_ref()
        .filter(|_| whole && json)
        .and_then(|t| t.error(status, &body));
    let body = if let Some((to, translated)) = translated {
        if to != status {
            resp.set_status(to)?;
            resp.set_reason_phrase(None)?;
        }
        bytes::Bytes::from(translated)
    } else if whole && json {
        bytes::Bytes::from(body)
    } else {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)])
            .trim()
            .to_string();
        let message = if text.is_empty() {
            format!("The upstream answered {status} with no body.")
        } else {
            format!("The upstream answered {status}: {text}")
        };
        resp.insert_header(http::header::CONTENT_TYPE, "application/json")?;
        let e = GatewayError::UpstreamReply(status, message);
        bytes::Bytes::from(e.body_in(ctx.shape, &ctx.request_id))
    };
    resp.remove_header(&http::header::TRANSFER_ENCODING);
    resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
    let bound = bound(ctx, life.as_deref());
    crate::http1::respond::header(session, &mut ctx.sent, bound, resp, false).await?;
    // Up to 1 MiB.
    crate::http1::respond::body(session, &mut ctx.sent, bound, Some(body), true).await?;
    if whole && upstream.client.response_done() {
        upstream.release(connections).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesced_pieces_are_the_same_bytes_in_order_and_one_piece_is_not_copied() {
        let one = Bytes::from_static(b"data: {\"a\":1}\n\n");
        let alone = Coalesced::new(Some(one.clone())).take().expect("piece");
        assert_eq!(alone.as_ptr(), one.as_ptr());

        let mut out = Coalesced::new(None);
        out.push(None);
        out.push(Some(Bytes::new()));
        assert_eq!(out.len(), 0);
        out.push(Some(one.clone()));
        out.push(None);
        out.push(Some(Bytes::from_static(b"data: [DONE]\n\n")));
        assert_eq!(out.len(), one.len() + 14);
        assert_eq!(
            out.take().expect("pieces"),
            Bytes::from_static(b"data: {\"a\":1}\n\ndata: [DONE]\n\n")
        );
        assert_eq!(Coalesced::new(None).take(), None);
    }
}
