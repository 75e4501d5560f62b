//! The proxy's own replies: the shared responder (`crate::respond`) plus the headers every
//! reply of a request carries (`reply_headers`, the upstream's too), and the outcome noted in
//! the context for the usage record.

use std::future::Future;

use bytes::Bytes;
use pingora_proxy::Session;

use crate::respond::Respond;

use super::ctx::{Ctx, Outcome};
use crate::error::GatewayError;

pub async fn json(
    session: &mut Session,
    ctx: &mut Ctx,
    status: u16,
    body: Vec<u8>,
) -> pingora_error::Result<()> {
    ctx.outcome = Outcome::Answered(status);
    let ctx = &*ctx;
    crate::respond::send(
        session,
        &ctx.request_id,
        ctx.bound(),
        status,
        "application/json",
        Bytes::from(body),
        |h| reply_headers(ctx, h),
    )
    .await
}

/// What every reply of the request carries besides `x-request-id`, the gateway's own and the
/// upstream's alike: the echoed `traceparent`, the key's `x-ratelimit-*` headroom and, for an
/// allowed browser origin, the CORS headers.
pub fn reply_headers(ctx: &Ctx, h: &mut pingora_http::ResponseHeader) -> pingora_error::Result<()> {
    if let Some(t) = &ctx.trace {
        h.insert_header("traceparent", t.traceparent(t.span_id))?;
    }
    crate::limit::rate::write_headers(&ctx.headroom, h)?;
    crate::cors::decorate(h, ctx.cors.as_ref())
}

/// Answers the request with `e` in its API's error shape, noting the outcome. Boxed: every
/// stage that can refuse awaits this on its cold path, and its future (the body drained, the
/// header and the body written, 1-3 KB) would otherwise be part of each stage's own, copied
/// on every request that is not refused.
pub fn error<'a>(
    session: &'a mut impl Respond,
    ctx: &'a mut Ctx,
    e: &'a GatewayError,
) -> std::pin::Pin<Box<dyn Future<Output = pingora_error::Result<()>> + Send + 'a>> {
    ctx.outcome = Outcome::Answered(e.status());
    if (400..500).contains(&e.status()) {
        ctx.refusal = Some(e.reason());
    }
    let ctx = &*ctx;
    Box::pin(crate::respond::error(
        session,
        &ctx.request_id,
        ctx.bound(),
        e,
        ctx.shape,
        |h| reply_headers(ctx, h),
    ))
}

/// Answers with `e`, a failure of the upstream's (or the shutdown's), noting how the request
/// ended: with the status sent, or, when the reply could not be written, as the write failed
/// (a client that had left is recorded 499, not the error it never got).
pub async fn failure(
    session: &mut impl Respond,
    ctx: &mut Ctx,
    e: &GatewayError,
) -> pingora_error::Result<()> {
    let sent = error(session, ctx, e).await;
    ctx.outcome = match &sent {
        Ok(()) => Outcome::UpstreamFailed(e.status()),
        Err(we) => Outcome::of_failed_write(we),
    };
    sent
}
