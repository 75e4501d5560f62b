//! Reading the whole request body in `request_filter` without losing it for the upstream.
//! Pingora only re-sends a pre-read body from its retry buffer, which holds at most 64 KiB and
//! returns nothing once more was written to it. So the buffer is switched on only when the
//! rest of a Content-Length body fits in it; it then holds a non-empty tail, Pingora calls
//! `request_body_filter(tail, eos)` once and the whole body is swapped in there.
//! A chunked body cannot be sized ahead: up to 64 KiB it goes the same way; larger ones are
//! sent by `direct.rs` with our own upstream client.

use bytes::{Bytes, BytesMut};
use pingora_proxy::Session;

use crate::error::GatewayError;

/// Pingora's `BODY_BUF_LIMIT`.
const RETRY_BUF: usize = 64 * 1024;

pub struct ReadBody {
    pub bytes: Bytes,
    /// Pingora's own pipe will deliver the body (retry buffer or empty body); if false the
    /// request must be forwarded by `direct::forward`.
    pub via_pingora: bool,
}

pub async fn read(
    session: &mut Session,
    limit: usize,
) -> pingora_error::Result<Result<ReadBody, GatewayError>> {
    let cl: Option<usize> = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    if cl.is_some_and(|n| n > limit) {
        return Ok(Err(GatewayError::RequestTooLarge(limit)));
    }
    if cl.is_none() {
        session.enable_retry_buffering();
    }
    let mut buf = BytesMut::with_capacity(cl.unwrap_or(8 * 1024).min(limit));
    loop {
        if let Some(cl) = cl {
            if cl.saturating_sub(buf.len()) <= RETRY_BUF {
                session.enable_retry_buffering();
            }
        }
        match session.read_request_body().await? {
            Some(chunk) => {
                buf.extend_from_slice(&chunk);
                if buf.len() > limit {
                    return Ok(Err(GatewayError::RequestTooLarge(limit)));
                }
            }
            None => break,
        }
    }
    let via_pingora = buf.is_empty() || session.get_retry_buffer().is_some();
    Ok(Ok(ReadBody {
        bytes: buf.freeze(),
        via_pingora,
    }))
}
