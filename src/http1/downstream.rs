//! The client's side of one exchange, as the gateway reads its request and writes its reply:
//! Pingora's `Session` (every request as it arrives, HTTP/1 or HTTP/2), or the gateway's own
//! connection ([`super::conn::Conn`]) once a stream left Pingora's request. Everything above
//! this layer (the proxy, the web stage, the writer that records what was sent) writes to a
//! `Downstream` and never asks which one it is.

use std::future::Future;

use bytes::Bytes;
use futures_util::FutureExt;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;

pub trait Downstream: Send {
    /// The request's method, target and version.
    fn asked(&self) -> &http::request::Parts;

    /// The request's header, to be rewritten for an upstream (its fields in their case).
    fn request(&self) -> pingora_error::Result<RequestHeader>;

    /// The request is a HEAD: its reply's header says what GET's body would be, and no body
    /// follows (HTTP/2 would send one as DATA frames, which a client must refuse).
    fn head_only(&self) -> bool {
        self.asked().method == http::Method::HEAD
    }

    /// Writes a reply's header (`end`: no body follows; the gateway's own connection knows
    /// that from the request's method and the reply's status).
    fn write_header(
        &mut self,
        h: Box<ResponseHeader>,
        end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_;

    /// Writes a piece of a reply's body (`None`: nothing new); `end` ends the body.
    fn write_body(
        &mut self,
        body: Option<Bytes>,
        end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_;

    /// Before a refusal: what is left of a small request body is read, so the connection
    /// stays usable (Pingora closes it otherwise); a large one is left and the connection
    /// closes after the reply.
    fn drain_small_body(&mut self) -> impl Future<Output = ()> + Send + '_;

    /// Resolves when the client closes its connection (its request was read whole, so the
    /// only thing left to read is the close). Never resolves otherwise.
    fn gone(&mut self) -> impl Future<Output = ()> + Send + '_;
}

impl Downstream for Session {
    fn asked(&self) -> &http::request::Parts {
        self.req_header()
    }

    fn request(&self) -> pingora_error::Result<RequestHeader> {
        Ok(self.req_header().clone())
    }

    /// (The session's own writer: the gateway runs no Pingora modules, so the proxy's
    /// `Session::write_response_header` would add nothing but their empty pass.)
    fn write_header(
        &mut self,
        h: Box<ResponseHeader>,
        _end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_ {
        self.as_downstream_mut().write_response_header(h)
    }

    fn write_body(
        &mut self,
        body: Option<Bytes>,
        end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_ {
        self.as_downstream_mut()
            .write_response_body(body.unwrap_or_default(), end)
    }

    fn drain_small_body(&mut self) -> impl Future<Output = ()> + Send + '_ {
        drain_small_body(self)
    }

    fn gone(&mut self) -> impl Future<Output = ()> + Send + '_ {
        client_gone(self)
    }
}

/// The client sent `Expect: 100-continue`: it holds its body back until a `100 Continue`.
/// Never an HTTP/1.0 client, which knows no interim replies and sends its body at once (RFC
/// 9110 §10.1.1: the expectation is ignored).
pub fn expects_continue(req: &RequestHeader) -> bool {
    req.version != http::Version::HTTP_10
        && req
            .headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// How long a refused request's small body is waited for before its answer goes.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The most of a refused request's body read so the connection stays usable.
const DRAIN_SMALL: usize = 64 * 1024;

async fn drain_small_body(session: &mut Session) {
    if session.is_body_done() {
        return;
    }
    // A client waiting for `100 Continue` sends its body only once it has that (or gives up
    // waiting): waiting for it would hold the answer back until then. What such a client sent
    // without waiting (RFC 9110 allows it) is read as far as it has come, so that closing the
    // connection does not reset the answer.
    if expects_continue(session.req_header()) {
        for _ in 0..16 {
            match session.read_request_body().now_or_never() {
                Some(Ok(Some(_))) => {}
                _ => break,
            }
        }
        return;
    }
    let small = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .is_some_and(|n| n <= DRAIN_SMALL);
    if small {
        // A failed or slow drain only means the connection will not be reused: a client
        // trickling its body does not hold the answer (nor a shutdown) for long.
        let drained = tokio::time::timeout(DRAIN_LIMIT, session.drain_request_body()).await;
        if !matches!(drained, Ok(Ok(()))) {
            session.as_downstream_mut().set_keepalive(None);
        }
    }
}

/// Resolves when the client closes its connection (its request body was read whole, so the
/// only thing left to read is the close). Never resolves otherwise.
async fn client_gone(session: &mut Session) {
    if session
        .as_downstream_mut()
        .read_body_or_idle(true)
        .await
        .is_err()
    {
        return;
    }
    // Bytes of a next request (pipelining) are not a close: keep waiting on the rest.
    std::future::pending::<()>().await
}
