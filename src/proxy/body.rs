//! Reading the whole request body in `request_filter`: the model is routed from it, and it is
//! sent upstream (maybe rewritten) by `forward.rs`, once per try.

use bytes::{Bytes, BytesMut};
use pingora_proxy::Session;

use crate::error::GatewayError;

/// The body's declared length.
fn declared_length(session: &Session) -> Option<usize> {
    session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok())
}

/// Why a body must be refused before a byte of it is read (and before a client waiting on
/// `Expect: 100-continue` is told to send it): a declared length over `limit`, or a
/// compressed body, which the gateway cannot read for its model (nor meter).
pub fn refuse_unread(session: &Session, limit: usize) -> Option<GatewayError> {
    if declared_length(session).is_some_and(|n| n > limit) {
        return Some(GatewayError::RequestTooLarge(limit));
    }
    // Every header and every coding in each: `identity` then `gzip` is gzip to the upstream.
    let encoding = session
        .req_header()
        .headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .find(|v| {
            v.as_bytes()
                .split(|b| *b == b',')
                .any(|c| !c.trim_ascii().eq_ignore_ascii_case(b"identity"))
        })?;
    Some(GatewayError::InvalidParameter {
        param: "content-encoding",
        message: format!(
            "Request bodies are read uncompressed: send it without Content-Encoding ({} was given).",
            String::from_utf8_lossy(encoding.as_bytes())
        ),
    })
}

pub async fn read(
    session: &mut Session,
    limit: usize,
) -> pingora_error::Result<Result<Bytes, GatewayError>> {
    let cl = declared_length(session);
    if cl.is_some_and(|n| n > limit) {
        return Ok(Err(GatewayError::RequestTooLarge(limit)));
    }
    let mut buf = BytesMut::with_capacity(cl.unwrap_or(8 * 1024).min(limit));
    loop {
        let chunk = match session.read_request_body().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => return crate::http1::respond::unreadable(session, e).map(Err),
        };
        buf.extend_from_slice(&chunk);
        if buf.len() > limit {
            return Ok(Err(GatewayError::RequestTooLarge(limit)));
        }
    }
    Ok(Ok(buf.freeze()))
}

/// The client sent `Expect: 100-continue` (see `http1::downstream::expects_continue`).
pub fn expects_continue(session: &Session) -> bool {
    crate::http1::downstream::expects_continue(session.req_header())
}

/// After a refusal answered before the body was read (a 401, a 413 over the length limit…):
/// reads and drops what the client is still sending, so that it can finish its upload and read
/// the answer instead of meeting a reset (the kernel resets a connection closed with unread
/// bytes). At most `cap` bytes within `within`; a client sending more, or slower, is closed.
pub async fn linger(session: &mut Session, cap: usize, within: std::time::Duration) {
    if session.is_body_done() {
        return;
    }
    let drained = tokio::time::timeout(within, async {
        let mut read = 0usize;
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    read += chunk.len();
                    if read > cap {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    })
    .await;
    if drained != Ok(true) {
        session.as_downstream_mut().set_keepalive(None);
    }
}
