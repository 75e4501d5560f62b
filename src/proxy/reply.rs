//! The upstream's reply on its way to the client: header fix-ups and the body filter. Shared by
//! Pingora's proxy path and the direct path so both treat replies the same.

use bytes::Bytes;
use pingora_error::{Error, ErrorSource, ErrorType};
use pingora_http::ResponseHeader;

use super::ctx::Ctx;
use crate::error::GatewayError;

/// Upstream 401/403 mean the gateway's own credential failed: the client gets 502
/// `upstream_error` instead of a misleading auth error. Every reply gets `x-request-id`.
pub fn on_upstream_header(ctx: &mut Ctx, resp: &mut ResponseHeader) -> pingora_error::Result<()> {
    let status = resp.status.as_u16();
    if status == 401 || status == 403 {
        let body: Bytes = GatewayError::UpstreamError(format!(
            "The upstream refused the gateway's credential (HTTP {status}); check the pool's api_key."
        ))
        .body()
        .into();
        resp.set_status(502)?;
        resp.remove_header(&http::header::TRANSFER_ENCODING);
        resp.remove_header(&http::header::CONTENT_ENCODING);
        resp.insert_header(http::header::CONTENT_TYPE, "application/json")?;
        resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
        ctx.replacement = Some(body);
        ctx.replacing = true;
    }
    resp.insert_header("x-request-id", ctx.request_id.as_str())?;
    ctx.status = resp.status.as_u16();
    Ok(())
}

/// Called for each piece of the reply body as it passes.
pub fn on_body(ctx: &mut Ctx, body: &mut Option<Bytes>, _eos: bool) {
    if ctx.replacing {
        // The first piece carries the whole replacement; later pieces are dropped.
        *body = ctx.replacement.take();
    }
}

/// The gateway error for a failure while proxying, or None when the client itself went away
/// (nobody to answer).
pub fn classify_failure(e: &Error) -> Option<GatewayError> {
    use ErrorType::*;
    let what = || format!("upstream failed: {}", e.etype().as_str());
    Some(match e.etype() {
        ConnectTimedout | ReadTimedout | WriteTimedout | TLSHandshakeTimedout
            if e.esource() != &ErrorSource::Downstream =>
        {
            GatewayError::UpstreamTimeout(what())
        }
        HTTPStatus(413) => GatewayError::RequestTooLarge(0),
        _ => match e.esource() {
            ErrorSource::Upstream => GatewayError::UpstreamError(what()),
            ErrorSource::Downstream => match e.etype() {
                WriteError | ReadError | ConnectionClosed | ReadTimedout | WriteTimedout => {
                    return None;
                }
                _ => GatewayError::InvalidParameter {
                    param: "body",
                    message: format!("bad request: {}", e.etype().as_str()),
                },
            },
            ErrorSource::Internal | ErrorSource::Unset => {
                GatewayError::Internal(format!("internal error: {}", e.etype().as_str()))
            }
        },
    })
}
