//! Reading the whole request body in `request_filter`: the model is routed from it, and it is
//! sent upstream (maybe rewritten) by `forward.rs`, once per try.

use bytes::{Bytes, BytesMut};
use pingora_proxy::Session;

use crate::error::GatewayError;

pub async fn read(
    session: &mut Session,
    limit: usize,
) -> pingora_error::Result<Result<Bytes, GatewayError>> {
    let cl: Option<usize> = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    if cl.is_some_and(|n| n > limit) {
        return Ok(Err(GatewayError::RequestTooLarge(limit)));
    }
    let mut buf = BytesMut::with_capacity(cl.unwrap_or(8 * 1024).min(limit));
    loop {
        let chunk = match session.read_request_body().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => {
                // Whatever follows a body that could not be read cannot be trusted as the next
                // request (a chunk size that overflows, say): the connection ends here.
                session.as_downstream_mut().set_keepalive(None);
                use pingora_error::ErrorType::*;
                return match e.etype() {
                    ReadError | ConnectionClosed | ReadTimedout => Err(e.into_down()),
                    other => Ok(Err(GatewayError::InvalidParameter {
                        param: "body",
                        message: format!(
                            "The request body could not be read: its framing is invalid ({}).",
                            other.as_str()
                        ),
                    })),
                };
            }
        };
        buf.extend_from_slice(&chunk);
        if buf.len() > limit {
            return Ok(Err(GatewayError::RequestTooLarge(limit)));
        }
    }
    Ok(Ok(buf.freeze()))
}
