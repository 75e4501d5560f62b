//! The proxy's own replies: the shared responder (`crate::respond`) plus this request's
//! `x-ratelimit-*` headers, and the outcome noted in the context for the usage record.

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
    let (headroom, cors) = (&ctx.headroom, ctx.cors.as_ref());
    let trace = traceparent(ctx);
    crate::respond::send(
        session,
        &ctx.request_id,
        status,
        "application/json",
        Bytes::from(body),
        |h| {
            crate::limit::rate::write_headers(headroom, h)?;
            echo_trace(h, trace)?;
            crate::cors::decorate(h, cors)
        },
    )
    .await
}

/// The request's `traceparent`, echoed on its reply.
pub fn traceparent(ctx: &Ctx) -> Option<String> {
    ctx.trace.as_ref().map(|t| t.traceparent(t.span_id))
}

pub fn echo_trace(
    h: &mut pingora_http::ResponseHeader,
    traceparent: Option<String>,
) -> pingora_error::Result<()> {
    match traceparent {
        Some(tp) => h.insert_header("traceparent", tp),
        None => Ok(()),
    }
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
    let (headroom, cors) = (&ctx.headroom, ctx.cors.as_ref());
    let trace = traceparent(ctx);
    crate::respond::error(session, &ctx.request_id, e, ctx.shape, |h| {
        crate::limit::rate::write_headers(headroom, h)?;
        echo_trace(h, trace)?;
        crate::cors::decorate(h, cors)
    })
    .await
}
