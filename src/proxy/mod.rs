//! The proxy: `Gateway` implements Pingora's `ProxyHttp`. `request_filter` runs the stages:
//! auth → permissions and budget → body and route (`admit`) → upstream tries and the metered
//! reply (`forward`); `logging` writes the usage record. Pingora's own upstream phases are not
//! used: one forwarding path owns retries, timeouts and cancellation for every body framing.

mod admit;
pub mod body;
pub mod ctx;
mod detach;
mod forward;
mod models;
mod outcome;
pub mod record;
mod relay;
pub mod reply;
mod reserve;
pub mod respond;
mod sending;

use std::sync::Arc;

use async_trait::async_trait;
use pingora_core::modules::http::HttpModules;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::http1::Downstream;
use crate::route::endpoint::Group;
use crate::web;
use admit::Stop;
use ctx::{Ctx, Listener};
use outcome::Failure;

/// What the proxy's requests share (built by `state::build`).
pub struct Shared {
    pub live: Arc<crate::route::live::Live>,
    pub metrics: Arc<crate::ops::metrics::Metrics>,
    pub store: Arc<crate::store::Store>,
    pub spend: Arc<crate::limit::budget::Spend>,
    pub limiter: crate::limit::rate::Limiter,
    /// `[limits] redis`: the limits and spend every gateway of a fleet shares.
    pub shared_limits: Option<Arc<crate::limit::shared::SharedLimits>>,
    /// The usage page, console and their APIs, served on the same listeners.
    pub web: Arc<web::Web>,
    /// Requests in flight, and the signal that ends them at shutdown.
    pub lifecycle: Arc<crate::ops::lifecycle::Lifecycle>,
    /// One line per request; None when `[log] access = "off"`.
    pub access_log: Option<crate::ops::access_log::AccessLog>,
    /// Which upstream made each stored response (Responses API).
    pub stored: crate::route::stored::StoredResponses,
}

pub struct Gateway {
    shared: Arc<Shared>,
    listener: Listener,
    /// The upstream connections (new, and idle ones kept for reuse) of `forward` (shared with
    /// the streams it hands to their own tasks, `detach`).
    connections: Arc<crate::upstream::Connections>,
}

impl Gateway {
    pub fn new(shared: Arc<Shared>, listener: Listener) -> Gateway {
        // (The start checked the trust store: this fails only if it changed since.)
        if let Err(e) =
            crate::upstream::warm_tls(shared.live.snapshot().router.pools.iter().map(|p| &p.cfg))
        {
            tracing::error!("{e}");
        }
        let connections = Arc::new(crate::upstream::Connections::new(shared.metrics.clone()));
        Gateway {
            shared,
            listener,
            connections,
        }
    }

    /// Decides the request. `Ok(true)`: answered here; `Ok(false)`: proxy it.
    async fn admit(&self, session: &mut Session, ctx: &mut Ctx) -> pingora_error::Result<bool> {
        ctx.trace = Some(crate::ops::telemetry::Trace::from_headers(
            &session.req_header().headers,
        ));
        // The client's address, for the throttles and the access log.
        ctx.client =
            crate::auth::client::ip(session, &self.shared.live.fixed.server.trusted_proxies);
        // An idle keep-alive connection is closed after `keepalive_timeout_ms`; the body left
        // unread by a reply (drained before the connection is used again) is waited for
        // `client_body_timeout_ms` at most.
        let downstream = session.as_downstream_mut();
        downstream.set_total_drain_timeout(Some(self.shared.live.fixed.server.client_body_timeout));
        if downstream.get_keepalive().is_some() {
            let secs = self
                .shared
                .live
                .fixed
                .server
                .keepalive_timeout
                .as_millis()
                .div_ceil(1000);
            downstream.set_keepalive(Some(secs.max(1) as u64));
        }
        if malformed_target(session.req_header().raw_path()) {
            let e = crate::error::GatewayError::InvalidParameter {
                param: "request",
                message: "The request line is not valid HTTP/1.1: a space too many around its \
                          target."
                    .into(),
            };
            session.as_downstream_mut().set_keepalive(None);
            respond::error(session, ctx, &e).await?;
            return Ok(true);
        }
        let path = session.req_header().uri.path();
        let web = web::owns(path);
        let cors_applies = !web || web::cors_path(path);
        if let (Some(cors), true) = (&self.shared.live.fixed.cors, cors_applies) {
            let req = session.req_header();
            ctx.cors = cors.allow(req.headers.get(http::header::ORIGIN));
            let preflight = req.method == http::Method::OPTIONS
                && req
                    .headers
                    .contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD);
            if preflight {
                self.preflight(session, ctx, cors).await?;
                return Ok(true);
            }
        }
        if web {
            // Boxed: the pages' futures are large and no part of a `/v1` request's.
            return Box::pin(self.web(session, ctx)).await;
        }
        // A full usage store (`on_store_full = "refuse"`) takes no new request: its record
        // could not be kept. Refused before auth, it leaves none.
        if self.shared.store.refuses() {
            let e = crate::error::GatewayError::StoreUnavailable;
            respond::error(session, ctx, &e).await?;
            return Ok(true);
        }
        match self.decide(session, ctx).await {
            Ok(()) if detach::early(session, ctx) => {
                detach::spawn_early(self, session, ctx);
                Ok(true)
            }
            Ok(()) => {
                match forward::run(self, session, ctx).await {
                    forward::Forwarded::Done(sent) => sent?,
                    forward::Forwarded::Reply(r) => {
                        relay_reply(&self.connections, session, ctx, r).await?;
                    }
                }
                Ok(true)
            }
            Err(Stop::Answered) => Ok(true),
            Err(Stop::Refuse(e)) => {
                // A client waiting for `100 Continue` that never came holds its body back (RFC
                // 9110 §10.1.1): nothing to drain, and the connection cannot carry another
                // request (its body would be read as one), so the answer closes it.
                let held_back = !ctx.body_asked && body::expects_continue(session);
                if held_back {
                    session.as_downstream_mut().set_keepalive(None);
                }
                respond::error(session, ctx, &e).await?;
                // The shutdown's cut waits for no upload.
                if !held_back && !matches!(e, crate::error::GatewayError::ShuttingDown) {
                    ctx.answered = Some(std::time::Instant::now());
                    let max_body = self.shared.live.fixed.limits.max_body_bytes;
                    let cap = max_body.saturating_mul(2).max(LINGER_BYTES);
                    body::linger(session, cap, LINGER).await;
                }
                Ok(true)
            }
            Err(Stop::Io(e)) => Err(e),
        }
    }
}

/// A request target Pingora rebuilt from a request line with a space too many (it escapes
/// what lies between the method and the version, spaces included, rather than refuse it):
/// `GET  /v1/models` reads as `%20/v1/models`, `POST /v1/x  HTTP/1.1` as `/v1/x%20`. No path of
/// the API begins or ends with a space, so either is the client's malformed line.
fn malformed_target(raw: &[u8]) -> bool {
    // (After a query the space is let be: a query value may end in an encoded space.)
    let path = raw.split(|b| *b == b'?').next().unwrap_or(raw);
    raw.starts_with(b"%20") || path.ends_with(b"%20")
}

/// How long a refused client may go on sending the body it had started.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);
/// How much of it is read at least (else twice `max_body_bytes`): with a small limit, an
/// upload a few times over it must still end in its answer, not a reset.
const LINGER_BYTES: usize = 16 << 20;

impl Gateway {
    /// Answers a CORS preflight: 204 with the allowed methods and headers for an allowed
    /// origin, else 403 `origin_not_allowed`. No key is needed (browsers send none).
    async fn preflight(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        cors: &crate::web::cors::Cors,
    ) -> pingora_error::Result<()> {
        let Some(allow) = ctx.cors.clone() else {
            let e = crate::error::GatewayError::OriginNotAllowed;
            return respond::error(session, ctx, &e).await;
        };
        let requested = session
            .req_header()
            .headers
            .get(http::header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned();
        let mut resp = pingora_http::ResponseHeader::build(204, Some(8))?;
        resp.insert_header("x-request-id", ctx.request_id.as_str())?;
        crate::web::cors::preflight(cors, &mut resp, &allow, requested.as_ref())?;
        let (w, _) = ctx.writing();
        crate::http1::respond::header(session, w.sent, w.bound, Box::new(resp), true).await
    }

    /// Hands a non-proxied path to the web stage; a key that passed auth there makes the
    /// request leave its usage record (group `usage`) like any other.
    async fn web(&self, session: &mut Session, ctx: &mut Ctx) -> pingora_error::Result<bool> {
        let mut ex = web::Exchange {
            request_id: ctx.request_id.clone(),
            listener: self.listener,
            client: ctx.client,
            key: None,
            sent: Default::default(),
            refusal: None,
            cors: ctx.cors.clone(),
            send_timeout: ctx.send_timeout,
            life: ctx
                .life
                .as_ref()
                .map(crate::ops::lifecycle::InFlight::lifecycle),
            time_ms: ctx.time_ms,
            journal: None,
        };
        let sent = web::serve(&self.shared.web, session, &mut ex).await;
        ctx.journal = ex.journal;
        ctx.key = ex.key;
        ctx.refusal = ex.refusal;
        ctx.sent = ex.sent;
        ctx.group = web::group_of(session.req_header().uri.path());
        sent.map(|()| true)
    }
}

/// Exports the request's spans (see `telemetry`).
fn trace(
    req: &http::request::Parts,
    ctx: &Ctx,
    r: &crate::store::UsageRecord,
    metering_started: std::time::Instant,
) {
    use opentelemetry::KeyValue;
    let Some(trace) = ctx.trace.as_ref() else {
        return;
    };
    let path = req.uri.path();
    // Span names stay few: a stored response's id is not part of its name.
    let route = if path.starts_with("/v1/responses/") {
        "/v1/responses/{id}"
    } else {
        path
    };
    let mut attributes = vec![
        KeyValue::new("http.request.method", req.method.to_string()),
        KeyValue::new("url.path", path.to_string()),
        KeyValue::new("http.response.status_code", i64::from(r.status)),
        KeyValue::new("modelgate.request_id", r.request_id.clone()),
        KeyValue::new("modelgate.listener", r.listener.clone()),
        KeyValue::new("modelgate.endpoint", r.endpoint.clone()),
        KeyValue::new("modelgate.attempts", i64::from(r.attempts)),
    ];
    if !r.key_id.is_empty() {
        attributes.push(KeyValue::new("modelgate.key_id", r.key_id.clone()));
    }
    if !r.model.is_empty() {
        attributes.push(KeyValue::new("gen_ai.request.model", r.model.clone()));
    }
    let metering_attributes = vec![
        KeyValue::new("gen_ai.usage.input_tokens", r.prompt_tokens as i64),
        KeyValue::new("gen_ai.usage.output_tokens", r.completion_tokens as i64),
        KeyValue::new("modelgate.cost", r.cost),
        KeyValue::new("modelgate.estimated", r.estimated),
    ];
    crate::ops::telemetry::export(crate::ops::telemetry::Finished {
        name: format!("{} {route}", req.method),
        started: ctx.started,
        started_at: std::time::UNIX_EPOCH + std::time::Duration::from_millis(ctx.time_ms as u64),
        status: r.status,
        attributes,
        metering: (metering_started, std::time::Instant::now()),
        metering_attributes,
        trace,
    });
}

/// The request's figures for the metrics.
fn observe(
    m: &crate::ops::metrics::Metrics,
    ctx: &Ctx,
    r: &crate::store::UsageRecord,
    ended: std::time::Instant,
) {
    let ms = |v: u64| std::time::Duration::from_millis(v);
    m.request_end(&crate::ops::metrics::RequestEnd {
        listener: ctx.listener.name(),
        endpoint: ctx.group,
        model: ctx.asked.as_ref().map_or("", |r| r.model.name.as_str()),
        status: r.status,
        refusal: ctx.refusal,
        total: ended.saturating_duration_since(ctx.started),
        upstream: ctx
            .route
            .as_ref()
            .filter(|_| ctx.attempts > 0)
            .map(|r| (r.pool.name.as_str(), ctx.upstream_time)),
        waited: ctx.waited,
        ttft: r.ttft_ms.map(ms),
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.completion_tokens,
        cost: r.cost,
        key: ctx.key.as_ref().map(|k| k.id.as_str()),
    });
}

/// Remembers which upstream made a new stored response; forgets a deleted one.
fn note_stored_response(shared: &Shared, req: &http::request::Parts, ctx: &Ctx, key_id: &str) {
    if req.method == http::Method::DELETE {
        if let Some(id) = req.uri.path().strip_prefix("/v1/responses/") {
            shared.stored.forget(id.trim_end_matches('/'));
        }
        return;
    }
    if req.method != http::Method::POST || ctx.pinned.is_some() {
        return;
    }
    let (Some(route), Some(id)) = (ctx.route.as_ref(), ctx.meter.response_id()) else {
        return;
    };
    let Some(up) = route.pool.upstreams.get(ctx.upstream) else {
        return;
    };
    let origin = crate::route::stored::Origin {
        key_id: key_id.to_string(),
        model: route.model.name.clone(),
        pool: route.pool.name.clone(),
        upstream: up.cfg.url.clone(),
    };
    shared.stored.remember(id, origin);
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        let mut ctx = Ctx::new(self.listener);
        ctx.life = Some(self.shared.lifecycle.enter());
        ctx.send_timeout = self.shared.live.fixed.server.client_send_timeout;
        ctx.finish_when_gone = self.shared.live.fixed.server.finish_when_gone;
        ctx
    }

    /// No response compression: the reply goes through as the upstream sent it. (No module
    /// at all: `relay::relay_body` writes to the client's session directly, past where
    /// Pingora would run them, while a reply's header goes through Pingora's `Session`, which
    /// runs them: a module added here would see headers and not bodies.)
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora_error::Result<bool> {
        crate::http1::listener::header_arrived(session);
        if self.shared.lifecycle.draining() {
            // Leaving rotation: the client's next request goes to a new connection, elsewhere.
            session.as_downstream_mut().set_keepalive(None);
        }
        self.admit(session, ctx).await
    }

    /// Never called: `request_filter` answers every request (see `forward`).
    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Ctx,
    ) -> pingora_error::Result<Box<HttpPeer>> {
        Err(Error::explain(
            ErrorType::InternalError,
            "no upstream phase",
        ))
    }

    /// Pingora's own error line goes: `finish` writes the request's, with its settled status
    /// (none for a client that left, or the shutdown's cut).
    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, _error: &Error) -> bool {
        true
    }

    /// Nothing is answered here: `logging`, which Pingora calls next, ends every request the
    /// same way (`finish`), in Pingora's request or in a stream's own task. The connection is
    /// not kept after a failure.
    async fn fail_to_proxy(
        &self,
        _session: &mut Session,
        _e: &Error,
        _ctx: &mut Ctx,
    ) -> FailToProxy {
        FailToProxy {
            // (Read only by the error line Pingora would write, which is off.)
            error_code: 0,
            can_reuse_downstream: false,
        }
    }

    /// Every request that passed auth leaves exactly one usage record, whatever its outcome
    /// (a stream handed to its own task leaves it there, `detach`).
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        if ctx.detached {
            return;
        }
        finish(&self.shared, session, e, ctx).await;
    }
}

/// Writes a success's header and relays its body where the request is (Pingora's request, or
/// a stream's own task), then notes its try's end.
async fn relay_reply<D: Downstream>(
    connections: &crate::upstream::Connections,
    client: &mut D,
    ctx: &mut Ctx,
    r: forward::Reply,
) -> pingora_error::Result<()> {
    let forward::Reply {
        upstream,
        resp,
        counted,
        end,
    } = r;
    let Some((pool, up)) = counted.at() else {
        return Err(Error::explain(
            pingora_error::ErrorType::InternalError,
            "the reply's upstream is not in its pool",
        ));
    };
    let sent = relay::reply(connections, client, ctx, (pool, up), upstream, resp).await;
    end.note(ctx, pool, up);
    sent
}

/// The end of every request, wherever it ends (Pingora's `logging`, or a stream's own task,
/// `detach`): a failure is answered when no reply began (nothing is, for a client that left),
/// the request's final status is settled from what was sent and the failure (`outcome`), the
/// failure gets its error line unless it is the client's or the shutdown's, and `end` writes
/// the rest.
async fn finish(shared: &Shared, client: &mut impl Downstream, e: Option<&Error>, ctx: &mut Ctx) {
    let failure = e.map(|e| (e, Failure::of(e)));
    if let Some((e, _)) = failure {
        if !ctx.sent.began() {
            if let Some(g) = reply::classify_failure(e) {
                if let Err(we) = respond::error(client, ctx, &g).await {
                    tracing::debug!(request_id = %ctx.request_id, "could not send the error: {we}");
                }
            }
        }
    }
    let status = outcome::settle(&ctx.sent, failure.map(|(_, f)| f));
    ctx.cut = outcome::cut(&ctx.sent, failure.map(|(_, f)| f));
    if let Some((e, f)) = failure {
        if !f.quiet(e) {
            tracing::error!(request_id = %ctx.request_id, "the request failed: {e}, status: {status}");
        }
    }
    end(shared, client.asked(), status, ctx).await;
}

/// The end of a request that passed auth: its usage record, access-log line, metrics and
/// spans, its tokens and spend counted against its key.
/// (Of the request's header only its method and target are read.)
async fn end(shared: &Shared, req: &http::request::Parts, status: u16, ctx: &mut Ctx) {
    // The request is in flight until its record is queued (the end of this hook), not
    // while Pingora then drains a body left unread: the shutdown waits for records only.
    let in_flight = ctx.life.take();
    let key = ctx.key.clone();
    // One clock read for the request's end: its latency, its metrics, its tpm tokens. A
    // refusal ended when it was sent (the upload drained after it is not its latency).
    let ended = ctx.answered.unwrap_or_else(std::time::Instant::now);
    // The request is over: its concurrency slot is free before any estimate is counted.
    ctx.slot = None;
    ctx.lease = None;
    let life = in_flight.as_ref().map(crate::ops::lifecycle::InFlight::get);
    let tokens = record::Tokens::of(ctx, status).resolve(life).await;
    let r = record::build(
        ctx,
        status,
        key.as_ref().map_or("", |k| k.id.as_str()),
        ended,
        tokens,
    );
    // Every request gets its access-log line, refused ones (no key) included.
    if let Some(log) = shared.access_log.as_ref().filter(|l| l.sampled()) {
        log.log(&access_line(shared, req, ctx, &r));
    }
    observe(&shared.metrics, ctx, &r, ended);
    if ctx.trace.as_ref().is_some_and(|t| t.recording()) {
        trace(req, ctx, &r, ended);
    }
    let Some(key) = key else { return };
    if ctx.group == Group::Responses.name() && record::succeeded(status) {
        note_stored_response(shared, req, ctx, &key.id);
    }
    // What the request held is replaced by what it cost, each in one step.
    let held = ctx.reservation.take().map(|r| *r).unwrap_or_default();
    match held.tokens {
        Some(hold) => hold.settle(r.total_tokens, ended),
        None => shared.limiter.add_tokens(&key, r.total_tokens, ended),
    }
    match held.budget {
        Some(hold) => hold.settle(r.cost),
        None => shared.spend.add(&key.id, r.cost),
    }
    if let Some(limits) = &shared.shared_limits {
        let tokens = if key.tpm.is_some() { r.total_tokens } else { 0 };
        limits.ended(&key.id, &r.request_id, tokens, r.cost, held.fleet);
    }
    let written = record::as_preclosed(ctx, &r);
    shared
        .store
        .record_journaled(r, ctx.journal.take(), written)
        .await;
}

/// The contract's 400 for a connection's first request that Pingora's reader refuses (a
/// malformed request line or header), on `listener`: the whole reply, closing the connection
/// (`http1::listener`). Counted as a refusal of the listener's.
pub fn unparseable_reply(
    listener: &'static str,
    metrics: &crate::ops::metrics::Metrics,
) -> Vec<u8> {
    let e = crate::error::GatewayError::InvalidParameter {
        param: "request",
        message: "The request is not valid HTTP/1.1: its request line or a header could not be \
                  parsed."
            .into(),
    };
    let body = e.body();
    metrics.unparseable(listener);
    let mut out = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         x-request-id: {}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n",
        body.len(),
        ctx::next_request_id(),
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// The request's access-log line.
fn access_line<'a>(
    shared: &Shared,
    req: &'a http::request::Parts,
    ctx: &'a Ctx,
    r: &'a crate::store::UsageRecord,
) -> crate::ops::access_log::Line<'a> {
    let mut path = req.uri.path();
    // A key pasted into a path (a model id, say) stays out of the log: such a request was
    // refused, so only refusals are looked into.
    if r.status >= 400 && r.status < 500 {
        let keys = &shared.live.snapshot().keys;
        if crate::auth::mentions_secret(keys, path) {
            path = "[redacted]";
        }
    }
    crate::ops::access_log::Line {
        time: crate::store::record::format_time(r.time_ms),
        kind: "access",
        request_id: &r.request_id,
        listener: &r.listener,
        method: req.method.as_str(),
        path,
        client: ctx.client,
        user_agent: req
            .headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok()),
        trace_id: ctx.trace.as_ref().map(|t| format!("{:032x}", t.trace_id)),
        key_id: &r.key_id,
        endpoint: &r.endpoint,
        model: &r.model,
        served_model: &r.served_model,
        upstream: &r.upstream,
        upstream_request_id: ctx
            .upstream_request_id
            .as_ref()
            .and_then(|v| v.to_str().ok()),
        status: r.status,
        stream: r.stream,
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.completion_tokens,
        total_tokens: r.total_tokens,
        cost: r.cost,
        latency_ms: r.latency_ms,
        ttft_ms: r.ttft_ms,
        attempts: r.attempts,
        cut: &r.cut,
    }
}
