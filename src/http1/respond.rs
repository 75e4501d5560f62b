//! The writer: every byte of a reply goes to the client through here (`header`, `body`), the
//! gateway's own replies (errors, model lists, pages, usage data: `send`, `error`, always with
//! `x-request-id`, a content type and an exact length) and the upstream's relayed alike. Each
//! write is bounded (the client's send timeout, the shutdown's cut), and each notes in the
//! request's [`Sent`] what reached the client: the reply's status, its bytes, whether it went
//! whole, and who cut it when a write failed. That record is what the request's final status
//! is settled from (`proxy::outcome`); nothing else writes it. `decorate` adds what a caller's
//! reply carries besides (rate-limit headers, a page's security headers).

use bytes::Bytes;
use pingora_http::ResponseHeader;

use crate::error::{ErrorShape, GatewayError};
use crate::http1::Downstream;
use crate::ops::lifecycle::Lifecycle;

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
            let cut = crate::ops::lifecycle::cut(bound.life);
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

/// What went to one request's client, as the writes here saw it. Only the writer changes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// The reply's status, once its header was written.
    pub status: Option<u16>,
    /// The reply's body bytes written.
    pub bytes: u64,
    /// The reply's end was written: the client has all of it.
    pub whole: bool,
    /// A write failed: who cut the reply.
    pub cut: Option<Cut>,
}

/// Who cut a reply whose write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The client left, or took nothing within `client_send_timeout_ms`.
    Client,
    /// The shutdown's grace period was over.
    Shutdown,
}

impl Cut {
    /// Who cut a write that failed with `e`.
    pub fn of(e: &pingora_error::Error) -> Cut {
        if is_shutdown_cut(e) {
            Cut::Shutdown
        } else {
            Cut::Client
        }
    }
}

impl Sent {
    /// A reply's header began (its status known); false once nothing more may be written.
    pub fn began(&self) -> bool {
        self.status.is_some() || self.cut.is_some()
    }

    fn wrote(
        &mut self,
        status: Option<u16>,
        bytes: usize,
        end: bool,
        r: &pingora_error::Result<()>,
    ) {
        match r {
            Ok(()) => {
                if status.is_some() {
                    self.status = status;
                }
                self.bytes += bytes as u64;
                self.whole |= end;
            }
            Err(e) => {
                self.cut.get_or_insert(Cut::of(e));
            }
        }
    }
}

/// One request's reply as the gateway writes it: whom it answers, what bounds each write, and
/// the record of what was sent.
pub struct Writing<'a> {
    pub request_id: &'a str,
    pub bound: Bound<'a>,
    pub sent: &'a mut Sent,
}

/// Writes a reply's header (`end`: no body follows), noting it in `sent`. (Not an `async fn`:
/// that would hold the write twice.)
pub fn header<'a, D: Downstream + ?Sized>(
    client: &'a mut D,
    sent: &'a mut Sent,
    bound: Bound<'a>,
    h: Box<ResponseHeader>,
    end: bool,
) -> impl std::future::Future<Output = pingora_error::Result<()>> + Send + 'a {
    use futures_util::FutureExt;
    let status = h.status.as_u16();
    bounded(bound, client.write_header(h, end)).map(move |r| {
        sent.wrote(Some(status), 0, end, &r);
        r
    })
}

/// Writes a piece of a reply's body (`None`: nothing new; `end`: the last), noting it in
/// `sent`.
pub fn body<'a, D: Downstream + ?Sized>(
    client: &'a mut D,
    sent: &'a mut Sent,
    bound: Bound<'a>,
    piece: Option<Bytes>,
    end: bool,
) -> impl std::future::Future<Output = pingora_error::Result<()>> + Send + 'a {
    use futures_util::FutureExt;
    let len = piece.as_ref().map_or(0, Bytes::len);
    bounded(bound, client.write_body(piece, end)).map(move |r| {
        sent.wrote(None, len, end, &r);
        r
    })
}

/// Sends a reply of the gateway's own, whole: `status`, `body` of `content_type`.
pub async fn send(
    session: &mut impl Downstream,
    w: Writing<'_>,
    status: u16,
    content_type: &str,
    body: Bytes,
    decorate: impl FnOnce(&mut ResponseHeader) -> pingora_error::Result<()>,
) -> pingora_error::Result<()> {
    let mut h = ResponseHeader::build(status, Some(6))?;
    h.insert_header("content-type", content_type)?;
    h.insert_header("content-length", body.len().to_string())?;
    h.insert_header("x-request-id", w.request_id)?;
    decorate(&mut h)?;
    let head_only = session.head_only();
    header(session, w.sent, w.bound, Box::new(h), head_only).await?;
    if !head_only {
        self::body(session, w.sent, w.bound, Some(body), true).await?;
    }
    Ok(())
}

/// A refusal in the error shape of the request's API. If the request body has not been read,
/// a small one is drained first so the connection stays usable (Pingora closes it otherwise);
/// a large one is left and the connection closes after the reply. A rate-limit refusal
/// carries `Retry-After`.
pub async fn error(
    session: &mut impl Downstream,
    w: Writing<'_>,
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
        GatewayError::StoreUnavailable => Some(5),
        _ => None,
    };
    let allow = match e {
        GatewayError::MethodNotAllowed(allow) => Some(*allow),
        _ => None,
    };
    let body = Bytes::from(e.body_in(shape, w.request_id));
    send(session, w, e.status(), "application/json", body, |h| {
        if let Some(secs) = retry_after {
            h.insert_header("retry-after", secs.to_string())?;
        }
        if let Some(allow) = allow {
            h.insert_header("allow", allow)?;
        }
        decorate(h)
    })
    .await
}

/// A body read that failed: the client's error (it went away or stalled), or the 400 for a
/// framing that cannot be read. Either way the connection ends after the answer: whatever
/// follows a body that could not be read cannot be trusted as the next request (a chunk size
/// that overflows, say).
pub fn unreadable(
    session: &mut pingora_proxy::Session,
    e: Box<pingora_error::Error>,
) -> pingora_error::Result<GatewayError> {
    session.as_downstream_mut().set_keepalive(None);
    use pingora_error::ErrorType::*;
    match e.etype() {
        ReadError | ConnectionClosed | ReadTimedout => Err(e.into_down()),
        other => Ok(GatewayError::InvalidParameter {
            param: "body",
            message: format!(
                "The request body could not be read: its framing is invalid ({}).",
                other.as_str()
            ),
        }),
    }
}
