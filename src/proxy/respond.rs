//! The proxy's own replies: the shared responder (`crate::respond`) plus the headers every
//! reply of a request carries (`reply_headers`, the upstream's too), and the outcome noted in
//! the context for the usage record.

use bytes::Bytes;
use pingora_proxy::Session;

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

pub async fn error(
    session: &mut Session,
    ctx: &mut Ctx,
    e: &GatewayError,
) -> pingora_error::Result<()> {
    ctx.outcome = Outcome::Answered(e.status());
    if (400..500).contains(&e.status()) {
        ctx.refusal = Some(e.reason());
    }
    let ctx = &*ctx;
    crate::respond::error(session, &ctx.request_id, ctx.bound(), e, ctx.shape, |h| {
        reply_headers(ctx, h)
    })
    .await
}
