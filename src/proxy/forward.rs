//! The one forwarding path: every admitted request, whatever its body's size or framing, goes
//! upstream through here. Per try: pick an upstream of the pool, connect, send the (already
//! read) body, wait for the reply header. Connect failures, resets and timeouts before the
//! reply, 429 and 5xx are tried again (on another upstream when the pool has one) after the
//! pool's backoff, up to `max_attempts`; nothing is retried once a byte of the reply has gone
//! to the client. A client that goes away is noticed at once on every wait, and the upstream
//! request is dropped with it. The reply streams back through `reply` (metering), under the
//! idle and whole-request deadlines; a reply cut midway ends without its final chunk, so the
//! client can tell.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use pingora_core::protocols::http::ServerSession;
use pingora_error::{Error, ErrorType};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use pingora_timeout::fast_timeout::fast_timeout;

use super::conn::Conn;
use super::ctx::{Ctx, Outcome};
use super::{Gateway, detach, reply, respond};
use crate::error::GatewayError;
use crate::lifecycle::{Lifecycle, cut};
use crate::respond::Respond;
use crate::route::balance::{InFlight, backoff};
use crate::route::body as route_body;
use crate::route::retry::{self, Next, Standing, Tried};
use crate::route::{Pool, Upstream};
use crate::upstream;

/// How one try ended before any of its reply reached the client.
enum Try {
    /// A reply header: pass it on (or retry it, for 429 and 5xx).
    Reply(Upstreamed, Box<ResponseHeader>),
    /// No reply: the error the client gets if no try succeeds.
    Failed(GatewayError),
    /// No reply before the plain request's whole deadline (`request_timeout`): no further
    /// try, and not held against the upstream, whose own limit had not passed.
    OutOfTime(GatewayError),
    /// The client went away.
    ClientGone,
    /// The gateway is shutting down and ends the request.
    ShuttingDown,
}

/// The upstream connection a reply is read from (it knows where it goes back to).
pub(super) struct Upstreamed {
    client: Box<upstream::Conn>,
}

impl Upstreamed {
    /// Returns the connection for reuse once its reply was read whole.
    async fn release(self, connections: &upstream::Connections) {
        connections.release(self.client).await;
    }
}

/// How a wait between tries ended.
enum Waited {
    Done,
    ClientGone,
    ShuttingDown,
}

/// How a pool's tries ended.
enum PoolEnd {
    /// The client has its reply (or went away): `Err` if the reply was cut.
    Done(pingora_error::Result<()>),
    /// No upstream of the pool could answer: the error to give if no fallback can either.
    CannotAnswer(GatewayError),
}

/// The client a request is forwarded for: Pingora's session (a plain reply, or any reply to
/// an HTTP/2 client), or a stream's own connection once the stream left Pingora's request
/// (`Conn`, `detach`).
pub(super) trait Client: Respond + Downstream {
    /// The client's request header, to be rewritten for an upstream.
    fn request(&self) -> pingora_error::Result<RequestHeader>;

    /// The request's method, target and version.
    fn asked(&self) -> &http::request::Parts;

    /// The connection a stream's reply goes on in a task of its own (`detach`), with the
    /// route it goes on from; `None`: the reply is relayed here.
    fn relay_apart(&mut self, ctx: &Ctx) -> Option<(Conn, std::sync::Arc<crate::route::Route>)>;
}

impl Client for Session {
    fn request(&self) -> pingora_error::Result<RequestHeader> {
        Ok(self.req_header().clone())
    }

    fn asked(&self) -> &http::request::Parts {
        self.req_header()
    }

    fn relay_apart(&mut self, _: &Ctx) -> Option<(Conn, std::sync::Arc<crate::route::Route>)> {
        None
    }
}

/// Forwards the request in `ctx` and streams the reply: to the route's pool, then, if it
/// cannot answer, to each fallback model's pool in turn (with that model's upstream name and
/// price). `Err` means the reply was cut after it began: the client's connection is then
/// dropped (by Pingora, or by the stream's own task) instead of ending the body cleanly.
pub(super) async fn run(
    gw: &Gateway,
    session: &mut impl Client,
    ctx: &mut Ctx,
) -> pingora_error::Result<()> {
    let Some(route) = ctx.route.clone() else {
        return Ok(());
    };
    let fallbacks = ctx.fallbacks.take();
    let routes = fallbacks.as_ref().map_or(&[][..], |f| &f.routes[..]);
    let mut error = None;
    for (n, next) in std::iter::once(&route).chain(routes).enumerate() {
        if n > 0 {
            if let Some(f) = &fallbacks {
                ctx.body = route_body::for_upstream(
                    &f.body,
                    &f.probe,
                    // The body names the model the client asked for.
                    next.upstream_rename(&route.model.name),
                    f.ask_usage,
                );
            }
            tracing::debug!(request_id = %ctx.request_id, model = %next.model.name, "fallback");
        }
        // A plain request past its whole deadline tries no fallback.
        if n > 0 && time_left(ctx, &next.pool, Instant::now()) == Some(Duration::ZERO) {
            break;
        }
        ctx.route = Some(next.clone());
        let more = n < routes.len();
        match try_pool(gw, session, ctx, &next.pool, more).await {
            PoolEnd::Done(result) => return result,
            PoolEnd::CannotAnswer(e) => error = Some(e),
        }
    }
    let e = error.unwrap_or_else(|| GatewayError::NoHealthyUpstream(route.pool.name.clone()));
    let _ = respond::failure(session, ctx, &e).await;
    Ok(())
}

/// Tries the pool's upstreams. Unless `more` (a fallback follows), the last try's reply is
/// passed on even when it is a 429 or 5xx.
async fn try_pool(
    gw: &Gateway,
    session: &mut impl Client,
    ctx: &mut Ctx,
    pool: &Pool,
    more: bool,
) -> PoolEnd {
    let mut tried: Vec<usize> = Vec::with_capacity(pool.cfg.max_attempts as usize);
    let mut last_error = None;
    // A request's own retries count once toward ejecting an upstream for 5xx: the same bad
    // request retried must not take a pool's only upstream out for everyone.
    let mut counted_5xx = false;
    let gone = |ctx: &mut Ctx| {
        ctx.outcome = Outcome::ClientGone;
        PoolEnd::Done(Ok(()))
    };
    let life = ctx.life.as_ref().map(|l| l.lifecycle());
    let life = life.as_deref();
    for attempt in 1..=pool.cfg.max_attempts {
        // A stored response lives on one upstream: every try goes there.
        let pick = ctx.pinned.or_else(|| pool.pick(&tried));
        let Some(i) = pick else { break };
        let Some(up) = pool.upstreams.get(i) else {
            break;
        };
        ctx.upstream = i;
        ctx.attempts += 1;
        let inflight = up.health.enter();
        let started = Instant::now();
        let span = ctx.trace.as_ref().map(|t| t.next_try());
        let tried_once = try_once(&gw.connections, session, ctx, pool, up, life, span).await;
        let try_ended = Instant::now();
        ctx.upstream_time += try_ended.saturating_duration_since(started);
        let outcome = outcome(&tried_once);
        if let Some(m) = crate::metrics::get() {
            m.attempt(&pool.name, &up.cfg.url, outcome, attempt > 1);
        }
        let replied = matches!(tried_once, Try::Reply(..));
        if !replied {
            note_try(ctx, span, started, pool, up, outcome);
        }
        let tried_as = match &tried_once {
            Try::Reply(_, resp) => Tried::Replied {
                status: resp.status.as_u16(),
                retry_after: retry_after(resp),
            },
            _ => Tried::Failed,
        };
        let upstream = match tried_once {
            Try::ClientGone => return gone(ctx),
            Try::ShuttingDown => return shutting_down(session, ctx).await,
            Try::OutOfTime(e) => {
                last_error = Some(e);
                break;
            }
            Try::Failed(e) => {
                pool.transport_failed(up);
                tracing::debug!(request_id = %ctx.request_id, upstream = %up.cfg.url, "try {attempt} failed: {e:?}");
                last_error = Some(e);
                None
            }
            Try::Reply(upstream, resp) => {
                if resp.status.as_u16() >= 500 {
                    if !counted_5xx {
                        pool.server_error(up);
                        counted_5xx = true;
                    }
                } else {
                    up.health.answered();
                }
                Some((upstream, resp))
            }
        };
        if tried_as.retryable() {
            tried.push(i);
        }
        let standing = Standing {
            attempt,
            max_attempts: pool.cfg.max_attempts,
            time_left: time_left(ctx, pool, try_ended),
            others_healthy: pool.has_healthy(&tried),
            any_healthy: pool.has_healthy(&[]),
            fallback: more,
            retry_cap: pool.cfg.retry_cap,
        };
        let retry_after = match (retry::next(tried_as, &standing), upstream) {
            (Next::PassOn, Some((upstream, resp))) => {
                let end = TryEnd {
                    span,
                    started,
                    replied: try_ended,
                    outcome,
                };
                let to = (pool, up, inflight);
                return PoolEnd::Done(
                    stream_reply(gw, session, ctx, to, upstream, resp, end).await,
                );
            }
            (Next::NextRoute | Next::PassOn, None) => break,
            (Next::NextRoute, Some((_, resp))) => {
                return PoolEnd::CannotAnswer(GatewayError::UpstreamError(format!(
                    "the upstream answered {}",
                    resp.status.as_u16()
                )));
            }
            (Next::Again, _) => continue,
            (Next::Wait { retry_after }, _) => retry_after,
        };
        match wait(session, ctx, pool, attempt + 1, retry_after, life).await {
            Waited::Done => {}
            Waited::ClientGone => return gone(ctx),
            Waited::ShuttingDown => return shutting_down(session, ctx).await,
        }
    }
    PoolEnd::CannotAnswer(
        last_error.unwrap_or_else(|| GatewayError::NoHealthyUpstream(pool.name.clone())),
    )
}

/// Answers 503 `shutting_down`: the shutdown ended the request before its reply began.
async fn shutting_down(session: &mut impl Respond, ctx: &mut Ctx) -> PoolEnd {
    let _ = respond::failure(session, ctx, &GatewayError::ShuttingDown).await;
    PoolEnd::Done(Ok(()))
}

/// Waits out the backoff before try `attempt`, unless the client leaves or the shutdown ends
/// the request meanwhile.
async fn wait(
    session: &mut impl Downstream,
    ctx: &mut Ctx,
    pool: &Pool,
    attempt: u32,
    retry_after: Option<Duration>,
    life: Option<&Lifecycle>,
) -> Waited {
    let mut delay = backoff(
        pool.cfg.retry_base,
        pool.cfg.retry_cap,
        attempt,
        retry_after,
    );
    let started = Instant::now();
    // A plain request waits no longer than its whole deadline: the try after it then ends at
    // once (504), rather than after the backoff.
    if let Some(left) = time_left(ctx, pool, started) {
        delay = delay.min(left);
    }
    let waited = tokio::select! {
        () = tokio::time::sleep(delay) => Waited::Done,
        () = session.gone() => Waited::ClientGone,
        () = cut(life) => Waited::ShuttingDown,
    };
    ctx.waited += started.elapsed();
    waited
}

/// What is left at `now` of a plain request's whole deadline (`request_timeout`, from its
/// start); None for a stream, which has no whole deadline.
fn time_left(ctx: &Ctx, pool: &Pool, now: Instant) -> Option<Duration> {
    (!ctx.stream).then(|| (ctx.started + pool.cfg.request_timeout).saturating_duration_since(now))
}

/// What is left to note of the try that answered once its reply is over: the reply's time,
/// and the try's span.
pub(super) struct TryEnd {
    span: Option<u64>,
    started: Instant,
    replied: Instant,
    outcome: &'static str,
}

impl TryEnd {
    pub(super) fn note(self, ctx: &mut Ctx, pool: &Pool, up: &Upstream) {
        ctx.upstream_time += self.replied.elapsed();
        note_try(ctx, self.span, self.started, pool, up, self.outcome);
    }
}

/// A try's span, when the request's trace is exported.
fn note_try(
    ctx: &mut Ctx,
    span: Option<u64>,
    start: Instant,
    pool: &Pool,
    up: &Upstream,
    outcome: &'static str,
) {
    let (Some(trace), Some(span_id)) = (ctx.trace.as_mut(), span) else {
        return;
    };
    if trace.recording() {
        trace.tries.push(crate::telemetry::TrySpan {
            span_id,
            start,
            end: Instant::now(),
            pool: pool.name.clone(),
            upstream: up.cfg.url.clone(),
            outcome,
        });
    }
}

/// How a try ended, for the metrics and its span.
fn outcome(tried: &Try) -> &'static str {
    match tried {
        Try::Reply(_, resp) => match resp.status.as_u16() {
            429 => "429",
            s if s >= 500 => "5xx",
            s if s >= 400 => "4xx",
            _ => "2xx",
        },
        Try::Failed(GatewayError::UpstreamTimeout(_)) | Try::OutOfTime(_) => "timeout",
        Try::Failed(_) => "error",
        Try::ClientGone => "client_gone",
        Try::ShuttingDown => "shutting_down",
    }
}

/// Resolves when the client closes its connection (its request body was read whole, so the
/// only thing left to read is the close). Never resolves otherwise.
async fn client_gone(session: &mut ServerSession) {
    if session.read_body_or_idle(true).await.is_err() {
        return;
    }
    // Bytes of a next request (pipelining) are not a close: keep waiting on the rest.
    std::future::pending::<()>().await
}

/// `Retry-After` in seconds (the HTTP-date form is not used by model servers).
fn retry_after(resp: &ResponseHeader) -> Option<Duration> {
    let v = resp.headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    let secs: f64 = v.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// The upstream's request for one try, as bytes: the client's header, rewritten for `up`,
/// with the try's span as its parent (the client's `tracestate` goes as it came). The header
/// itself is not held while the reply is awaited.
fn upstream_request(
    session: &impl Client,
    ctx: &Ctx,
    up: &Upstream,
    span: Option<u64>,
) -> pingora_error::Result<upstream::Request> {
    let mut req = session.request()?;
    upstream::rewrite_request(&mut req, up, ctx.body.len(), &ctx.request_id)?;
    if let (Some(t), Some(span)) = (ctx.trace.as_ref(), span) {
        req.insert_header("traceparent", t.traceparent(span))?;
    }
    upstream::Request::of(&req)
}

/// One try up to the reply header.
async fn try_once(
    connections: &upstream::Connections,
    session: &mut impl Client,
    ctx: &mut Ctx,
    pool: &Pool,
    up: &Upstream,
    life: Option<&Lifecycle>,
    span: Option<u64>,
) -> Try {
    let peer = up.peer();
    let req = match upstream_request(session, ctx, up, span) {
        Ok(req) => req,
        Err(e) => return Try::Failed(GatewayError::Internal(format!("upstream request: {e}"))),
    };
    let body = &ctx.body;
    let keep = &pool.cfg.pass_headers;
    let exchange = connections.exchange(&peer, |client| ask(client, &req, body, keep));
    // A plain reply's whole deadline (`request_timeout`) caps the wait for its header too.
    let left =
        time_left(ctx, pool, Instant::now()).filter(|left| *left < pool.cfg.first_byte_timeout);
    let timed = fast_timeout(left.unwrap_or(pool.cfg.first_byte_timeout), exchange);
    let result = tokio::select! {
        biased;
        r = timed => r,
        () = session.gone() => return Try::ClientGone,
        () = cut(life) => return Try::ShuttingDown,
    };
    match result {
        Err(_) if left.is_some() => Try::OutOfTime(GatewayError::UpstreamTimeout(format!(
            "the upstream's reply was not whole within the request timeout ({} ms)",
            pool.cfg.request_timeout.as_millis()
        ))),
        Err(_) => Try::Failed(GatewayError::UpstreamTimeout(format!(
            "the upstream sent no reply within {} ms",
            pool.cfg.first_byte_timeout.as_millis()
        ))),
        // Everything in `exchange` talks to the upstream: its errors are the upstream's.
        Ok(Err(e)) => match reply::classify_failure(&e.into_up()) {
            Some(g) => Try::Failed(g),
            None => Try::ClientGone,
        },
        Ok(Ok(mut client)) => match client.take_response_header() {
            // The request asked for no upgrade: a model API switching protocols is broken.
            Some(resp) if resp.status == 101 => Try::Failed(GatewayError::UpstreamError(
                "the upstream answered 101 Switching Protocols".into(),
            )),
            Some(resp) => Try::Reply(Upstreamed { client }, resp),
            None => Try::Failed(GatewayError::UpstreamError(
                "the upstream sent no reply header".into(),
            )),
        },
    }
}

/// Sends the request on `client` and reads the reply's header, past any informational ones,
/// with only the fields a client of the pool may get (and those that frame the reply).
async fn ask(
    mut client: Box<upstream::Conn>,
    req: &upstream::Request,
    body: &Bytes,
    keep: &crate::config::headers::PassHeaders,
) -> pingora_error::Result<Box<upstream::Conn>> {
    client.send(req, body).await?;
    client.read_final_header(Some(keep)).await?;
    Ok(client)
}

/// Passes the reply on, metered. Errors before the header reached the client are answered in
/// the contract's shape; after it, the reply is cut (`Err`). A stream to an HTTP/1 client goes
/// on in a task of its own (`detach`), which notes the try's end and writes the record.
async fn stream_reply(
    gw: &Gateway,
    session: &mut impl Client,
    ctx: &mut Ctx,
    (pool, up, inflight): (&Pool, &Upstream, InFlight<'_>),
    upstream: Upstreamed,
    resp: Box<ResponseHeader>,
    end: TryEnd,
) -> pingora_error::Result<()> {
    let sent = match pass_on(gw, session, ctx, pool, upstream, resp).await {
        Err(sent) => sent,
        Ok((upstream, resp)) => match session.relay_apart(ctx) {
            Some((conn, route)) => {
                detach::spawn(gw, conn, ctx, (route, inflight), upstream, resp, end);
                return Ok(());
            }
            None => match write_header(ctx, session, resp).await {
                Ok(()) => relay_body(&gw.connections, session, ctx, pool, up, upstream).await,
                Err(e) => Err(e),
            },
        },
    };
    end.note(ctx, pool, up);
    sent
}

/// The reply's header checked: `Ok` with a success to relay, or `Err` with how the request
/// ended (an error reply, answered or passed on).
async fn pass_on(
    gw: &Gateway,
    session: &mut impl Client,
    ctx: &mut Ctx,
    pool: &Pool,
    upstream: Upstreamed,
    mut resp: Box<ResponseHeader>,
) -> Result<(Upstreamed, Box<ResponseHeader>), pingora_error::Result<()>> {
    // Whether the upstream's body has a known end (before the header is edited).
    let framed = crate::http1::framing::framed(&resp.headers);
    if let Err(e) = reply::on_upstream_header(ctx, &mut resp, &pool.cfg.pass_headers) {
        if let Some(g) = reply::classify_failure(&e) {
            let _ = respond::failure(session, ctx, &g).await;
        }
        return Err(Ok(()));
    }
    if !ctx.outcome.succeeded() {
        // Boxed: the error path's future is no part of a reply that succeeds.
        let passed = pass_error(&gw.connections, session, ctx, pool, upstream, resp);
        return Err(Box::pin(passed).await);
    }
    ctx.accepted = true;
    if let crate::meter::Meter::Sse(m) = &mut ctx.meter {
        if !framed || resp.headers.contains_key(http::header::CONTENT_LENGTH) {
            m.keep_unterminated();
        }
    }
    crate::respond::frame_unknown_length(session.asked(), &mut resp).map_err(Err)?;
    Ok((upstream, resp))
}

/// Writes a success's header to the client (within the client's send timeout and the
/// shutdown's cut, as every write).
pub(super) async fn write_header(
    ctx: &mut Ctx,
    session: &mut impl Respond,
    resp: Box<ResponseHeader>,
) -> pingora_error::Result<()> {
    let life = ctx.life.as_ref().map(|l| l.lifecycle());
    let header = session.write_header(resp, false);
    write(ctx, life.as_deref(), header).await
}

/// Where a relayed reply's body goes: the client's session, which frames it, or a detached
/// stream's own connection (`Conn`), which frames it as the session would.
pub(super) trait Downstream: Send {
    /// Writes a piece of the body (`None`: nothing new); `done` ends the body.
    fn body(
        &mut self,
        piece: Option<Bytes>,
        done: bool,
    ) -> impl std::future::Future<Output = pingora_error::Result<()>> + Send + '_;

    /// Resolves when the client closes its connection (its request was read whole, so the
    /// only thing left to read is the close). Never resolves otherwise.
    fn gone(&mut self) -> impl std::future::Future<Output = ()> + Send + '_;
}

impl Downstream for Session {
    fn body(
        &mut self,
        piece: Option<Bytes>,
        done: bool,
    ) -> impl std::future::Future<Output = pingora_error::Result<()>> + Send + '_ {
        self.as_downstream_mut()
            .write_response_body(piece.unwrap_or_default(), done)
    }

    fn gone(&mut self) -> impl std::future::Future<Output = ()> + Send + '_ {
        client_gone(self.as_downstream_mut())
    }
}

/// Relays a success's body, its header written: as it comes, metered, under the idle and
/// whole-request deadlines. A failure cuts the reply (`Err`).
pub(super) async fn relay_body<D: Downstream>(
    connections: &upstream::Connections,
    session: &mut D,
    ctx: &mut Ctx,
    pool: &Pool,
    up: &Upstream,
    mut upstream: Upstreamed,
) -> pingora_error::Result<()> {
    let life = ctx.life.as_ref().map(|l| l.lifecycle());
    // A stream may go quiet for `idle_timeout` between events; a plain reply must be whole
    // within `request_timeout` of the start.
    let deadline = (!ctx.stream).then(|| ctx.started + pool.cfg.request_timeout);
    loop {
        // One clock read per piece: the idle limit, capped by what is left of the whole deadline.
        let limit = deadline.map_or(pool.cfg.idle_timeout, |d| {
            d.saturating_duration_since(Instant::now())
                .min(pool.cfg.idle_timeout)
        });
        let read = fast_timeout(limit, upstream.client.read_response_body());
        // The upstream's piece first: when one is already there, the client's connection is not
        // polled (a read that would only say EAGAIN) and the shutdown signal not looked at; a
        // client that left is still noticed while the upstream is quiet, or by the next write.
        let chunk = tokio::select! {
            biased;
            r = read => r,
            () = session.gone() => {
                ctx.outcome = Outcome::ClientGone;
                return Err(Error::explain(ErrorType::ConnectionClosed, "client went away").into_down());
            }
            () = cut(life.as_deref()) => return Err(shut(ctx)),
        };
        let mut chunk = match chunk {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                pool.transport_failed(up);
                ctx.outcome = Outcome::UpstreamFailed(502);
                return Err(e.into_up());
            }
            Err(_) => {
                ctx.outcome = Outcome::UpstreamFailed(504);
                return Err(Error::explain(
                    ErrorType::ReadTimedout,
                    "the upstream's reply stalled past its deadline",
                )
                .into_up());
            }
        };
        let mut done = chunk.is_none() || upstream.client.response_done();
        reply::on_body(ctx, &mut chunk, done);
        // The pieces the upstream has already sent go out in one write (one send, one wake of
        // the client), as Pingora's own proxy loop does; a piece still on its way is not
        // waited for. Each is metered as it is taken.
        let mut failed = None;
        let mut out = Coalesced::new(chunk);
        while !done && out.len() < COALESCE_MAX {
            let Some(next) = upstream.client.read_response_body().now_or_never() else {
                break;
            };
            match next {
                Ok(mut c) => {
                    done = c.is_none() || upstream.client.response_done();
                    reply::on_body(ctx, &mut c, done);
                    out.push(c);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let piece = out.take();
        if piece.is_some() || done {
            let piece = session.body(piece, done);
            write(ctx, life.as_deref(), piece).await?;
        }
        if let Some(e) = failed {
            pool.transport_failed(up);
            ctx.outcome = Outcome::UpstreamFailed(502);
            return Err(e.into_up());
        }
        if done {
            break;
        }
    }
    upstream.release(connections).await;
    Ok(())
}

/// Writes to the client (the reply's header or a piece of its body). A client that does not
/// read holds the write for at most `client_send_timeout_ms` (then the reply ends as the
/// client's: 499); the shutdown ends it all the same. Either failure names the outcome.
/// (Not an `async fn`: that would hold `write` twice.)
fn write<'a, T>(
    ctx: &'a mut Ctx,
    life: Option<&'a Lifecycle>,
    write: impl std::future::Future<Output = pingora_error::Result<T>> + 'a,
) -> impl std::future::Future<Output = pingora_error::Result<T>> + 'a {
    use futures_util::TryFutureExt;
    let bound = crate::respond::Bound {
        limit: ctx.send_timeout,
        life,
    };
    crate::respond::bounded(bound, write)
        .inspect_err(move |e| ctx.outcome = Outcome::of_failed_write(e))
}

/// A reply the shutdown ended: its record says 503, and the client's connection is cut.
fn shut(ctx: &mut Ctx) -> Box<Error> {
    ctx.outcome = Outcome::UpstreamFailed(GatewayError::ShuttingDown.status());
    crate::respond::shutdown_cut()
}

/// The most reply bytes gathered into one write to the client.
const COALESCE_MAX: usize = 64 * 1024;

/// Reply pieces gathered for one write: the first kept as it is (no copy when it is alone).
struct Coalesced {
    first: Option<Bytes>,
    more: Option<BytesMut>,
}

impl Coalesced {
    fn new(first: Option<Bytes>) -> Coalesced {
        Coalesced { first, more: None }
    }

    fn len(&self) -> usize {
        match &self.more {
            Some(m) => m.len(),
            None => self.first.as_ref().map_or(0, Bytes::len),
        }
    }

    fn push(&mut self, piece: Option<Bytes>) {
        let Some(piece) = piece.filter(|p| !p.is_empty()) else {
            return;
        };
        if self.first.as_ref().is_none_or(Bytes::is_empty) && self.more.is_none() {
            self.first = Some(piece);
            return;
        }
        let more = self.more.get_or_insert_with(|| {
            let first = self.first.take().unwrap_or_default();
            let mut m = BytesMut::with_capacity(first.len() + piece.len() * 4);
            m.extend_from_slice(&first);
            m
        });
        more.extend_from_slice(&piece);
    }

    fn take(self) -> Option<Bytes> {
        match self.more {
            Some(m) => Some(m.freeze()),
            None => self.first,
        }
    }
}

/// The most of an upstream's error body the gateway reads to check its shape.
const ERROR_BODY_MAX: usize = 1024 * 1024;

/// An upstream's error reply (status kept): a JSON body passes unchanged; an empty or non-JSON
/// one is wrapped in the contract's error shape, so clients always get `{"error": …}`.
async fn pass_error(
    connections: &upstream::Connections,
    session: &mut impl Respond,
    ctx: &mut Ctx,
    pool: &Pool,
    mut upstream: Upstreamed,
    mut resp: Box<ResponseHeader>,
) -> pingora_error::Result<()> {
    let status = resp.status.as_u16();
    let mut body = Vec::new();
    let read = async {
        while let Some(chunk) = upstream.client.read_response_body().await? {
            body.extend_from_slice(&chunk);
            if body.len() > ERROR_BODY_MAX || upstream.client.response_done() {
                break;
            }
        }
        Ok::<(), Box<Error>>(())
    };
    // An upstream that sends its error header and then stalls holds the request for at most
    // the idle limit; the shutdown's cut ends the wait at once. No reply has begun then: the
    // client is told the gateway is shutting down, as while it waits for the header.
    let life = ctx.life.as_ref().map(|l| l.lifecycle());
    let read = tokio::select! {
        r = fast_timeout(pool.cfg.idle_timeout, read) => r,
        () = cut(life.as_deref()) => {
            let _ = respond::failure(session, ctx, &GatewayError::ShuttingDown).await;
            return Ok(());
        }
    };
    let whole = match read {
        Ok(Ok(())) => body.len() <= ERROR_BODY_MAX,
        _ => false,
    };
    let json = !body.is_empty() && serde_json::from_slice::<serde_json::Value>(&body).is_ok();
    let body = if whole && json {
        bytes::Bytes::from(body)
    } else {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)])
            .trim()
            .to_string();
        let message = if text.is_empty() {
            format!("The upstream answered {status} with no body.")
        } else {
            format!("The upstream answered {status}: {text}")
        };
        resp.insert_header(http::header::CONTENT_TYPE, "application/json")?;
        let e = GatewayError::UpstreamReply(status, message);
        bytes::Bytes::from(e.body_in(ctx.shape, &ctx.request_id))
    };
    resp.remove_header(&http::header::TRANSFER_ENCODING);
    resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
    let header = session.write_header(resp, false);
    write(ctx, life.as_deref(), header).await?;
    // Up to 1 MiB.
    write(ctx, life.as_deref(), session.write_body(Some(body), true)).await?;
    if whole && upstream.client.response_done() {
        upstream.release(connections).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesced_pieces_are_the_same_bytes_in_order_and_one_piece_is_not_copied() {
        let one = Bytes::from_static(b"data: {\"a\":1}\n\n");
        let alone = Coalesced::new(Some(one.clone())).take().expect("piece");
        assert_eq!(alone.as_ptr(), one.as_ptr());

        let mut out = Coalesced::new(None);
        out.push(None);
        out.push(Some(Bytes::new()));
        assert_eq!(out.len(), 0);
        out.push(Some(one.clone()));
        out.push(None);
        out.push(Some(Bytes::from_static(b"data: [DONE]\n\n")));
        assert_eq!(out.len(), one.len() + 14);
        assert_eq!(
            out.take().expect("pieces"),
            Bytes::from_static(b"data: {\"a\":1}\n\ndata: [DONE]\n\n")
        );
        assert_eq!(Coalesced::new(None).take(), None);
    }
}
