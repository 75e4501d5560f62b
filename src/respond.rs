//! Writing the gateway's own replies (errors, model lists, pages, usage data) to the client:
//! always with `x-request-id`, a content type and an exact length. The proxy and the web stage
//! both answer through here; `decorate` adds what a caller's reply carries besides (rate-limit
//! headers, a page's security headers).

use std::future::Future;

use bytes::Bytes;
use futures_util::FutureExt;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

use crate::error::{ErrorShape, GatewayError};
use crate::lifecycle::Lifecycle;

/// A reply whose length is not known up front goes chunked to an HTTP/1.1 client, so a reply
/// cut short shows as cut (no final chunk). Without it Pingora would end the body by closing
/// the connection, which a client takes for a whole reply (and the header said keep-alive).
/// HTTP/2 frames its own bodies (Pingora drops the header there); HTTP/1.0 knows no chunks.
pub fn frame_unknown_length(
    req: &http::request::Parts,
    h: &mut ResponseHeader,
) -> pingora_error::Result<()> {
    let bodiless = matches!(h.status.as_u16(), 204 | 304) || req.method == http::Method::HEAD;
    if !crate::http1::framing::framed(&h.headers)
        && !bodiless
        && req.version == http::Version::HTTP_11
    {
        h.insert_header(http::header::TRANSFER_ENCODING, "chunked")?;
    }
    Ok(())
}

/// What bounds every write of a reply to one client: a client that takes nothing for `limit`
/// (`client_send_timeout_ms`) is cut, and so is every reply once the shutdown's grace period is
/// over, so no write holds a request (and its record) past the exit.
#[derive(Clone, Copy)]
pub struct Bound<'a> {
    pub limit: std::time::Duration,
    pub life: Option<&'a Lifecycle>,
}

/// Runs one write to the client within `bound`. A write that completes at once, the usual
/// case, arms no timer and never looks at the cut: the write is polled first, and the wait for
/// its deadline and the cut is made only once it waits. One that waits ends in the client's
/// error (a 499 in the record) after `limit`, or in `shutdown_cut` when the shutdown cuts.
///
/// A future written out rather than an `async fn` with `select!`: that one held the write
/// three times over (as its argument, in the select's pair, and in its caller's argument),
/// and every reply's write and every future that awaits one carried the copies (a body
/// write's future was 2.6 KB, of which Pingora's own is 0.8).
pub fn bounded<'a, T, F>(bound: Bound<'a>, write: F) -> Bounded<'a, F>
where
    F: std::future::Future<Output = pingora_error::Result<T>>,
{
    Bounded {
        write,
        bound,
        wait: None,
    }
}

/// A waiting write's deadline (`fast_timeout`'s, made once the write waits, as it would be
/// around the write itself) around the wait for the shutdown's cut: `Err` when the deadline
/// passed, `Ok` when the shutdown cut.
type Wait<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(), pingora_timeout::Elapsed>> + Send + 'a>,
>;

pin_project_lite::pin_project! {
    /// The future of [`bounded`].
    pub struct Bounded<'a, F> {
        #[pin]
        write: F,
        bound: Bound<'a>,
        wait: Option<Wait<'a>>,
    }
}

impl<T, F> std::future::Future for Bounded<'_, F>
where
    F: std::future::Future<Output = pingora_error::Result<T>>,
{
    type Output = pingora_error::Result<T>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let me = self.project();
        if let Poll::Ready(r) = me.write.poll(cx) {
            return Poll::Ready(r);
        }
        let bound = *me.bound;
        let wait = me.wait.get_or_insert_with(|| {
            let cut = crate::lifecycle::cut(bound.life);
            Box::pin(pingora_timeout::fast_timeout::fast_timeout(
                bound.limit,
                cut,
            ))
        });
        match wait.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(_)) => Poll::Ready(Err(pingora_error::Error::explain(
                pingora_error::ErrorType::WriteTimedout,
                "the client took nothing of the reply within client_send_timeout_ms",
            )
            .into_down())),
            Poll::Ready(Ok(())) => Poll::Ready(Err(shutdown_cut())),
        }
    }
}

const SHUT_DOWN: &str = "ended by the shutdown";

/// The error that ends a reply the shutdown cut (its record says 503 `shutting_down`).
pub fn shutdown_cut() -> Box<pingora_error::Error> {
    pingora_error::Error::explain(
        pingora_error::ErrorType::Custom(SHUT_DOWN),
        "the grace period is over",
    )
}

pub fn is_shutdown_cut(e: &pingora_error::Error) -> bool {
    e.etype() == &pingora_error::ErrorType::Custom(SHUT_DOWN)
}

/// The status a reply whose write failed is recorded with: 503 for the shutdown's cut, else
/// 499 (the client left, or took nothing within `client_send_timeout_ms`).
pub fn failed_write_status(e: &pingora_error::Error) -> u16 {
    if is_shutdown_cut(e) {
        GatewayError::ShuttingDown.status()
    } else {
        499
    }
}

/// A client the gateway's own replies are written to: Pingora's session, or a stream's own
/// connection once it left Pingora's request (`proxy::conn::Conn`).
pub trait Respond: Send {
    /// The request is a HEAD: its reply's header says what GET's body would be, and no body
    /// follows (HTTP/2 would send one as DATA frames, which a client must refuse).
    fn head_only(&self) -> bool;

    /// A reply's header went out already.
    fn replied(&self) -> bool;

    /// Writes a reply's header (`end`: no body follows; a stream's own connection knows that
    /// from the request's method and the reply's status).
    fn write_header(
        &mut self,
        h: Box<ResponseHeader>,
        end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_;

    /// Writes a piece of a reply's body (`end`: the last).
    fn write_body(
        &mut self,
        body: Option<Bytes>,
        end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_;

    /// Before a refusal: what is left of a small request body is read, so the connection
    /// stays usable (Pingora closes it otherwise); a large one is left and the connection
    /// closes after the reply.
    fn drain_small_body(&mut self) -> impl Future<Output = ()> + Send + '_;
}

impl Respond for Session {
    fn head_only(&self) -> bool {
        self.req_header().method == http::Method::HEAD
    }

    fn replied(&self) -> bool {
        self.response_written().is_some()
    }

    fn write_header(
        &mut self,
        h: Box<ResponseHeader>,
        end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_ {
        self.write_response_header(h, end)
    }

    fn write_body(
        &mut self,
        body: Option<Bytes>,
        end: bool,
    ) -> impl Future<Output = pingora_error::Result<()>> + Send + '_ {
        self.write_response_body(body, end)
    }

    fn drain_small_body(&mut self) -> impl Future<Output = ()> + Send + '_ {
        drain_small_body(self)
    }
}

pub async fn send(
    session: &mut impl Respond,
    request_id: &str,
    bound: Bound<'_>,
    status: u16,
    content_type: &str,
    body: Bytes,
    decorate: impl FnOnce(&mut ResponseHeader) -> pingora_error::Result<()>,
) -> pingora_error::Result<()> {
    let mut h = ResponseHeader::build(status, Some(6))?;
    h.insert_header("content-type", content_type)?;
    h.insert_header("content-length", body.len().to_string())?;
    h.insert_header("x-request-id", request_id)?;
    decorate(&mut h)?;
    let head_only = session.head_only();
    bounded(bound, async {
        session.write_header(Box::new(h), head_only).await?;
        if !head_only {
            session.write_body(Some(body), true).await?;
        }
        Ok(())
    })
    .await
}

/// A refusal in the error shape of the request's API. If the request body has not been read,
/// a small one is drained first so the connection stays usable (Pingora closes it otherwise);
/// a large one is left and the connection closes after the reply. A rate-limit refusal
/// carries `Retry-After`.
pub async fn error(
    session: &mut impl Respond,
    request_id: &str,
    bound: Bound<'_>,
    e: &GatewayError,
    shape: ErrorShape,
    decorate: impl FnOnce(&mut ResponseHeader) -> pingora_error::Result<()>,
) -> pingora_error::Result<()> {
    // A body that stalled past its deadline is not waited for again, nor one the shutdown cut.
    if !matches!(
        e,
        GatewayError::RequestTimeout(_) | GatewayError::ShuttingDown
    ) {
        session.drain_small_body().await;
    }
    let retry_after = match e {
        GatewayError::RateLimited { retry_after, .. } => Some(*retry_after),
        GatewayError::LimiterUnavailable => Some(1),
        _ => None,
    };
    let allow = match e {
        GatewayError::MethodNotAllowed(allow) => Some(*allow),
        _ => None,
    };
    let body = Bytes::from(e.body_in(shape, request_id));
    send(
        session,
        request_id,
        bound,
        e.status(),
        "application/json",
        body,
        |h| {
            if let Some(secs) = retry_after {
                h.insert_header("retry-after", secs.to_string())?;
            }
            if let Some(allow) = allow {
                h.insert_header("allow", allow)?;
            }
            decorate(h)
        },
    )
    .await
}

/// How long a refused request's small body is waited for before its answer goes.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

async fn drain_small_body(session: &mut Session) {
    if session.is_body_done() {
        return;
    }
    // A client waiting for `100 Continue` sends its body only once it has that (or gives up
    // waiting): waiting for it would hold the answer back until then. What such a client sent
    // without waiting (RFC 9110 allows it) is read as far as it has come, so that closing the
    // connection does not reset the answer.
    if crate::proxy::body::expects_continue(session) {
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
        .is_some_and(|n| n <= 64 * 1024);
    if small {
        // A failed or slow drain only means the connection will not be reused: a client
        // trickling its body does not hold the answer (nor a shutdown) for long.
        let drained = tokio::time::timeout(DRAIN_LIMIT, session.drain_request_body()).await;
        if !matches!(drained, Ok(Ok(()))) {
            session.as_downstream_mut().set_keepalive(None);
        }
    }
}
