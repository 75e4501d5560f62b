//! The one forwarding path: every admitted request, whatever its body's size or framing, goes
//! upstream through here. Per try: pick an upstream of the pool, connect, send the (already
//! read) body, wait for the reply header; then `route::retry` says what comes next (connect
//! failures, resets and timeouts before the reply, 429 and 5xx are tried again, on another
//! upstream when the pool has one, after the pool's backoff, up to `max_attempts`). A client
//! that goes away is noticed at once on every wait, and the upstream request is dropped with
//! it. A success's checked header comes back to the caller, which relays it (`relay`, here or
//! in a stream's own task): nothing is retried once a byte of the reply has gone to the
//! client.

use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_timeout::fast_timeout::fast_timeout;

use super::ctx::Ctx;
use super::relay::{self, Counted, Upstreamed};
use super::{Gateway, reply, respond};
use crate::error::GatewayError;
use crate::http1::Downstream;
use crate::ops::lifecycle::{Lifecycle, cut};
use crate::route::Pool;
use crate::route::balance::backoff;
use crate::route::retry::{self, Next, Standing, Tried};
use crate::upstream;
use crate::upstream::Upstream;
use crate::upstream::health::InFlight;

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
    /// The client went away while the upstream worked, and the reply (header) was waited
    /// for all the same (`on_client_gone = "finish"`), if one came.
    GoneBeforeReply(Option<(Upstreamed, Box<ResponseHeader>)>),
    /// The gateway is shutting down and ends the request.
    ShuttingDown,
}

/// How a wait between tries ended.
enum Waited {
    Done,
    ClientGone,
    ShuttingDown,
}

/// How forwarding a request ended.
pub(super) enum Forwarded {
    /// The client has its answer (an error, an upstream's error reply passed on): `Err` if
    /// it went away, the request failed unanswered, or the reply was cut after it began.
    Done(pingora_error::Result<()>),
    /// A success's header, checked: the caller writes it and relays the body.
    Reply(Reply),
}

/// A success to relay: the upstream connection its body comes on, its header (as the client
/// gets it), its upstream counted in flight until the relay ends, and its try to note then.
pub(super) struct Reply {
    pub upstream: Upstreamed,
    pub resp: Box<ResponseHeader>,
    pub counted: Counted,
    pub end: TryEnd,
}

/// How a pool's tries ended.
enum PoolEnd {
    /// The client has its reply: `Err` if it went away, or the reply was cut.
    Done(pingora_error::Result<()>),
    /// A success, to relay.
    Reply(Reply),
    /// No upstream of the pool could answer: the error to give if no fallback can either.
    CannotAnswer(GatewayError),
}

/// Forwards the request in `ctx`: to the route's pool, then, if it cannot answer, to each
/// fallback model's pool in turn (with that model's upstream name and price). A success comes
/// back to relay; anything else is answered here. `Done(Err)` means the client went away, or
/// the request failed unanswered, or a reply was cut after it began: the request's end
/// (`finish`) answers what it can, and the client's connection is then dropped (by Pingora,
/// or by the stream's own task) instead of ending a body cleanly.
pub(super) async fn run(gw: &Gateway, session: &mut impl Downstream, ctx: &mut Ctx) -> Forwarded {
    let Some(route) = ctx.route.clone() else {
        let e = pingora_error::Error::explain(
            pingora_error::ErrorType::InternalError,
            "an admitted request without a route",
        );
        return Forwarded::Done(Err(e));
    };
    let fallbacks = ctx.fallbacks.take();
    let routes = fallbacks.as_ref().map_or(&[][..], |f| &f.routes[..]);
    let mut error = None;
    for (n, next) in std::iter::once(&route).chain(routes).enumerate() {
        if n > 0 {
            if let Some(f) = &fallbacks {
                // The body names the model the client asked for; a pool that cannot take
                // the request (its provider has no equivalent) is passed over.
                if let Err(e) = super::sending::for_route(ctx, &f.sending, next, &next.model.name) {
                    error = Some(e);
                    continue;
                }
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
            PoolEnd::Done(result) => return Forwarded::Done(result),
            PoolEnd::Reply(reply) => return Forwarded::Reply(reply),
            PoolEnd::CannotAnswer(e) => error = Some(e),
        }
    }
    let e = error.unwrap_or_else(|| GatewayError::NoHealthyUpstream(route.pool.name.clone()));
    let _ = respond::error(session, ctx, &e).await;
    Forwarded::Done(Ok(()))
}

/// Tries the pool's upstreams. Unless `more` (a fallback follows), the last try's reply is
/// passed on even when it is a 429 or 5xx.
async fn try_pool(
    gw: &Gateway,
    session: &mut impl Downstream,
    ctx: &mut Ctx,
    pool: &Pool,
    more: bool,
) -> PoolEnd {
    let mut tried: Vec<usize> = Vec::with_capacity(pool.cfg.max_attempts as usize);
    let mut last_error = None;
    let mut counted_5xx = false;
    let gone = || PoolEnd::Done(Err(super::outcome::client_left()));
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
        let outcome = end_try(ctx, pool, up, &tried_once, span, started);
        gw.shared
            .metrics
            .attempt(&pool.name, &up.cfg.url, outcome, attempt > 1);
        let tried_as = match &tried_once {
            Try::Reply(_, resp) => Tried::Replied {
                status: resp.status.as_u16(),
                retry_after: retry_after(resp),
            },
            _ => Tried::Failed,
        };
        let upstream = match tried_once {
            Try::ClientGone => {
                // Its prompt was with the upstream (`on_client_gone = "cancel"`): billed,
                // estimated.
                ctx.abandoned = true;
                return gone();
            }
            Try::GoneBeforeReply(reply) => {
                return finish_gone(gw, ctx, (pool, up), reply, &mut counted_5xx).await;
            }
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
                answered(pool, up, resp.status.as_u16(), &mut counted_5xx);
                Some((upstream, resp))
            }
        };
        if tried_as.retryable() {
            tried.push(i);
        }
        let next = next_step(ctx, pool, tried_as, attempt, try_ended, &tried, more);
        let retry_after = match (next, upstream) {
            (Next::PassOn, Some((upstream, resp))) => {
                let end = TryEnd {
                    span,
                    started,
                    replied: try_ended,
                    outcome,
                };
                let to = (pool, up, inflight);
                return accept(gw, session, ctx, to, upstream, resp, end).await;
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
            Waited::ClientGone => return gone(),
            Waited::ShuttingDown => return shutting_down(session, ctx).await,
        }
    }
    PoolEnd::CannotAnswer(
        last_error.unwrap_or_else(|| GatewayError::NoHealthyUpstream(pool.name.clone())),
    )
}

/// The client left while the upstream worked (`on_client_gone = "finish"`): a success is read
/// to its end, unsent, for its usage (`relay::finish_unsent`). The request ends as the
/// client's.
async fn finish_gone(
    gw: &Gateway,
    ctx: &mut Ctx,
    (pool, up): (&Pool, &Upstream),
    reply: Option<(Upstreamed, Box<ResponseHeader>)>,
    counted_5xx: &mut bool,
) -> PoolEnd {
    let left = super::outcome::client_left();
    let Some((upstream, mut resp)) = reply else {
        return PoolEnd::Done(Err(left));
    };
    answered(pool, up, resp.status.as_u16(), counted_5xx);
    if !resp.status.is_success()
        || reply::on_upstream_header(ctx, &mut resp, &pool.cfg.pass_headers).is_err()
    {
        return PoolEnd::Done(Err(left));
    }
    ctx.accepted = true;
    let finished = relay::finish_unsent(&gw.connections, ctx, pool, upstream, left);
    PoolEnd::Done(Box::pin(finished).await)
}

/// How a try ended; unless it brought a reply (whose try ends with its relay), its span ends.
fn end_try(
    ctx: &mut Ctx,
    pool: &Pool,
    up: &Upstream,
    tried: &Try,
    span: Option<u64>,
    started: Instant,
) -> &'static str {
    let outcome = outcome(tried);
    if !matches!(tried, Try::Reply(..)) {
        note_try(ctx, span, started, pool, up, outcome);
    }
    outcome
}

/// An upstream's reply, for its health: a 5xx counts toward ejecting it, once per request (the
/// same bad request retried must not take a pool's only upstream out for everyone); anything
/// else says it answers.
fn answered(pool: &Pool, up: &Upstream, status: u16, counted_5xx: &mut bool) {
    if status >= 500 {
        if !*counted_5xx {
            pool.server_error(up);
            *counted_5xx = true;
        }
    } else {
        up.health.answered();
    }
}

/// What follows a try (`route::retry`). A reply no try could change (a success, a client's
/// error) passes on without the pool's health being looked over for it.
fn next_step(
    ctx: &Ctx,
    pool: &Pool,
    tried_as: Tried,
    attempt: u32,
    try_ended: Instant,
    tried: &[usize],
    fallback: bool,
) -> Next {
    if !tried_as.retryable() {
        return Next::PassOn;
    }
    let standing = Standing {
        attempt,
        max_attempts: pool.cfg.max_attempts,
        time_left: time_left(ctx, pool, try_ended),
        others_healthy: pool.has_healthy(tried),
        any_healthy: pool.has_healthy(&[]),
        fallback,
        retry_cap: pool.cfg.retry_cap,
    };
    retry::next(tried_as, &standing)
}

/// Answers 503 `shutting_down`: the shutdown ended the request before its reply began.
async fn shutting_down(session: &mut impl Downstream, ctx: &mut Ctx) -> PoolEnd {
    let _ = respond::error(session, ctx, &GatewayError::ShuttingDown).await;
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
        trace.tries.push(crate::ops::telemetry::TrySpan {
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
        Try::ClientGone | Try::GoneBeforeReply(_) => "client_gone",
        Try::ShuttingDown => "shutting_down",
    }
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
    session: &impl Downstream,
    ctx: &Ctx,
    up: &Upstream,
    span: Option<u64>,
) -> pingora_error::Result<upstream::Request> {
    let mut req = session.request()?;
    upstream::rewrite_request(
        &mut req,
        up,
        ctx.body.len(),
        &ctx.request_id,
        ctx.upstream_path,
    )?;
    if let (Some(t), Some(span)) = (ctx.trace.as_ref(), span) {
        req.insert_header("traceparent", t.traceparent(span))?;
    }
    upstream::Request::of(&req)
}

/// One try up to the reply header.
async fn try_once(
    connections: &upstream::Connections,
    session: &mut impl Downstream,
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
    tokio::pin!(timed);
    // A client that leaves while the upstream works: with `on_client_gone = "finish"` the
    // reply is still waited for (and read, unsent, for its usage: `finish_gone`).
    let mut gone = false;
    let result = loop {
        tokio::select! {
            biased;
            r = &mut timed => break r,
            () = session.gone(), if !gone => {
                if !ctx.finish_when_gone {
                    return Try::ClientGone;
                }
                gone = true;
            }
            () = cut(life) => return Try::ShuttingDown,
        }
    };
    if gone {
        return match result {
            Ok(Ok(mut client)) => match client.take_response_header() {
                Some(resp) => Try::GoneBeforeReply(Some((Upstreamed { client }, resp))),
                None => Try::GoneBeforeReply(None),
            },
            _ => Try::GoneBeforeReply(None),
        };
    }
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

/// The reply's header checked: an error reply is answered or passed on here (`Done`); a
/// success goes back to the caller to relay (`Reply`), its upstream counted in flight until
/// the relay ends.
async fn accept(
    gw: &Gateway,
    session: &mut impl Downstream,
    ctx: &mut Ctx,
    (pool, up, inflight): (&Pool, &Upstream, InFlight<'_>),
    upstream: Upstreamed,
    resp: Box<ResponseHeader>,
    end: TryEnd,
) -> PoolEnd {
    match pass_on(gw, session, ctx, pool, upstream, resp).await {
        Err(sent) => {
            end.note(ctx, pool, up);
            PoolEnd::Done(sent)
        }
        Ok((upstream, resp)) => {
            let Some(route) = ctx.route.clone() else {
                end.note(ctx, pool, up);
                return PoolEnd::CannotAnswer(GatewayError::Internal("no route".into()));
            };
            inflight.keep();
            let counted = Counted {
                route,
                upstream: ctx.upstream,
            };
            PoolEnd::Reply(Reply {
                upstream,
                resp,
                counted,
                end,
            })
        }
    }
}

/// The reply's header checked: `Ok` with a success to relay, or `Err` with how the request
/// ended (an error reply, answered or passed on).
async fn pass_on(
    gw: &Gateway,
    session: &mut impl Downstream,
    ctx: &mut Ctx,
    pool: &Pool,
    upstream: Upstreamed,
    mut resp: Box<ResponseHeader>,
) -> Result<(Upstreamed, Box<ResponseHeader>), pingora_error::Result<()>> {
    // Whether the upstream's body has a known end (before the header is edited).
    let framed = crate::http1::framing::framed(&resp.headers);
    if let Err(e) = reply::on_upstream_header(ctx, &mut resp, &pool.cfg.pass_headers) {
        if let Some(g) = reply::classify_failure(&e) {
            let _ = respond::error(session, ctx, &g).await;
        }
        return Err(Ok(()));
    }
    if !resp.status.is_success() {
        // Boxed: the error path's future is no part of a reply that succeeds.
        let passed = relay::pass_error(&gw.connections, session, ctx, pool, upstream, resp);
        return Err(Box::pin(passed).await);
    }
    ctx.accepted = true;
    if let crate::meter::Meter::Sse(m) = &mut ctx.meter {
        if !framed || resp.headers.contains_key(http::header::CONTENT_LENGTH) {
            m.keep_unterminated();
        }
    }
    crate::http1::respond::frame_unknown_length(session.asked(), &mut resp).map_err(Err)?;
    Ok((upstream, resp))
}
