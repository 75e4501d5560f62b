//! Writing the gateway's own replies (errors, model lists) to the client, always with
//! `x-request-id`, a JSON content type and an exact length.

use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

use super::ctx::Ctx;
use crate::error::GatewayError;

pub async fn json(
    session: &mut Session,
    ctx: &mut Ctx,
    status: u16,
    body: Vec<u8>,
) -> pingora_error::Result<()> {
    bytes(session, ctx, status, "application/json", body.into()).await
}

pub async fn bytes(
    session: &mut Session,
    ctx: &mut Ctx,
    status: u16,
    content_type: &str,
    body: Bytes,
) -> pingora_error::Result<()> {
    let mut h = ResponseHeader::build(status, Some(4))?;
    h.insert_header("content-type", content_type)?;
    h.insert_header("content-length", body.len().to_string())?;
    h.insert_header("x-request-id", ctx.request_id.as_str())?;
    crate::limit::rate::write_headers(&ctx.headroom, &mut h)?;
    if let Some(secs) = ctx.retry_after.take() {
        h.insert_header("retry-after", secs.to_string())?;
    }
    ctx.status = status;
    session.write_response_header(Box::new(h), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(())
}

/// A refusal. If the request body has not been read, a small one is drained first so the
/// connection stays usable (Pingora closes it otherwise); a large one is left and the
/// connection closes after the reply.
pub async fn error(
    session: &mut Session,
    ctx: &mut Ctx,
    e: &GatewayError,
) -> pingora_error::Result<()> {
    if !session.is_body_done() {
        let small = session
            .req_header()
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
            .is_some_and(|n| n <= 64 * 1024);
        if small {
            // A failed drain only means the connection will not be reused.
            let _ = session.drain_request_body().await;
        }
    }
    if let GatewayError::RateLimited { retry_after, .. } = e {
        ctx.retry_after = Some(*retry_after);
    }
    json(session, ctx, e.status(), e.body()).await
}
