//! The proxy's own replies, through the writer (`crate::http1::respond`), with the headers every
//! reply of a request carries (`reply_headers`, the upstream's too).

use std::future::Future;

use bytes::Bytes;

use super::ctx::{Ctx, Decor};
use crate::error::GatewayError;
use crate::http1::Downstream;

pub async fn json(
    session: &mut impl Downstream,
    ctx: &mut Ctx,
    status: u16,
    body: Vec<u8>,
) -> pingora_error::Result<()> {
    let (w, decor) = ctx.writing();
    crate::http1::respond::send(
        session,
        w,
        status,
        "application/json",
        Bytes::from(body),
        |h| reply_headers(&decor, h),
    )
    .await
}

/// What every reply of the request carries besides `x-request-id`, the gateway's own and the
/// upstream's alike: the echoed `traceparent`, the key's `x-ratelimit-*` headroom and, for an
/// allowed browser origin, the CORS headers.
pub fn reply_headers(
    decor: &Decor<'_>,
    h: &mut pingora_http::ResponseHeader,
) -> pingora_error::Result<()> {
    if let Some(t) = decor.trace {
        h.insert_header("traceparent", t.traceparent(t.span_id))?;
    }
    crate::limit::rate::write_headers(decor.headroom, h)?;
    crate::web::cors::decorate(h, decor.cors)
}

/// Answers the request with `e` in its API's error shape (a 4xx is counted as the gateway's
/// refusal). Boxed: every stage that can refuse awaits this on its cold path, and its future
/// (the body drained, the header and the body written, 1-3 KB) would otherwise be part of each
/// stage's own, copied on every request that is not refused.
pub fn error<'a>(
    session: &'a mut impl Downstream,
    ctx: &'a mut Ctx,
    e: &'a GatewayError,
) -> std::pin::Pin<Box<dyn Future<Output = pingora_error::Result<()>> + Send + 'a>> {
    if (400..500).contains(&e.status()) {
        ctx.refusal = Some(e.reason());
    }
    let shape = ctx.shape;
    Box::pin(async move {
        let (w, decor) = ctx.writing();
        crate::http1::respond::error(session, w, e, shape, |h| reply_headers(&decor, h)).await
    })
}
