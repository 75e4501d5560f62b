//! Admission of a `/v1` request, one stage a call: target → key → limits → endpoint permission
//! → budget → body → model route → the upstream request. Each stage returns `Result<_, Stop>`;
//! the first refusal is answered in one place (`Gateway::admit`), before any upstream is
//! touched. The budget is checked before the body is read, so a spent key costs no upload
//! (except on a path the contract does not name, which is an endpoint (`other`) only when its
//! body names a model: its permission and budget come after the body).

use std::sync::Arc;

use bytes::Bytes;
use pingora_error::Error;
use pingora_proxy::Session;

use super::ctx::{Ctx, Fallbacks, Sending};
use super::{Gateway, body, models, respond};
use crate::auth;
use crate::config::keys::{Key, KeyTable};
use crate::error::GatewayError;
use crate::limit::rate::Refusal;
use crate::limit::shared::OnDown;
use crate::meter::Meter;
use crate::ops::lifecycle::InFlight;
use crate::route::body as route_body;
use crate::route::endpoint::{BodyKind, Endpoint, Group, Metering, Target, classify};
use crate::route::stored::StoredResponses;
use crate::route::{Found, Route, Router};
use crate::store::journal::SentRef;

/// Why admission stopped before the proxy.
pub(super) enum Stop {
    /// A refusal to answer in the contract's error shape.
    Refuse(GatewayError),
    /// The gateway answered itself (the model list).
    Answered,
    /// The client connection failed.
    Io(Box<Error>),
}

impl From<GatewayError> for Stop {
    fn from(e: GatewayError) -> Stop {
        Stop::Refuse(e)
    }
}

impl From<Box<Error>> for Stop {
    fn from(e: Box<Error>) -> Stop {
        Stop::Io(e)
    }
}

impl Gateway {
    /// Admits the request (or answers it). The journal entry of a request whose key passed
    /// auth is opened as it is admitted (with what it sends upstream), or before it waits on
    /// anything (Redis, a slow body); either way it is written before anything goes upstream
    /// or back to the client.
    pub(super) async fn decide(&self, session: &mut Session, ctx: &mut Ctx) -> Result<(), Stop> {
        let decided = self.admission(session, ctx).await;
        journal_written(&self.shared.store, ctx).await;
        decided
    }

    async fn admission(&self, session: &mut Session, ctx: &mut Ctx) -> Result<(), Stop> {
        // One snapshot of keys and router for the whole request.
        let snapshot = self.shared.live.snapshot();
        let target = target(session, ctx, &snapshot.keys)?;
        let key = self.authenticate(&snapshot.keys, session, ctx);
        if let Some(t) = ctx.trace.as_mut() {
            t.auth_done = Some(std::time::Instant::now());
        }
        let key = key?;
        if self.shared.shared_limits.is_some() {
            // Redis is waited on: the entry is written first.
            journal_written(&self.shared.store, ctx).await;
        }
        let fleet_spend = self.limit(&key, ctx).await?;
        let endpoint = match target {
            Target::Proxy(ep) => ep,
            Target::StoredResponse(id) => {
                permit_endpoint(&key, STORED_RESPONSE, ctx)?;
                let body = read_body(session, ctx, &self.shared).await?;
                return route_stored(&self.shared.stored, &snapshot.router, &key, &id, ctx, body);
            }
            other => {
                // Answered here: the entry is written before the answer.
                journal_written(&self.shared.store, ctx).await;
                let router = &snapshot.router;
                return Err(answer_models(session, ctx, &key, router, &snapshot.keys, other).await);
            }
        };
        // A path the contract does not name is an endpoint (`other`) only when its body names
        // a model: else it is a 404, whatever the key may use.
        let other = endpoint.group == Group::Other;
        ctx.group = endpoint.group.name();
        if !other {
            self.permit(&key, endpoint, fleet_spend)?;
        }
        let read = read_body(session, ctx, &self.shared).await?;
        let probe = match probe(session, endpoint, &read).await {
            Ok(p) => p,
            Err(_) if other => {
                let path = session.req_header().uri.path().to_string();
                return Err(GatewayError::NotFound(path).into());
            }
            Err(e) => return Err(e.into()),
        };
        if other {
            self.permit(&key, endpoint, fleet_spend)?;
        }
        // The fields each API requires besides `model` (caught here, the client gets the
        // gateway's 400 in its API's shape, not whatever the upstream makes of it).
        match session.req_header().uri.path() {
            "/v1/chat/completions" | "/v1/messages/count_tokens" => {
                route_body::require_messages(&probe)?;
            }
            "/v1/messages" => {
                route_body::require_messages(&probe)?;
                route_body::require_max_tokens(&probe)?;
            }
            _ => {}
        }
        ctx.model = probe.model.clone();
        ctx.stream = probe.stream;
        let route = routed(ctx, &snapshot, &key, &probe.model)?;
        let path = session.req_header().uri.path();
        let asking = super::reserve::Asking {
            key: &key,
            endpoint,
            path,
            route: &route,
            router: &snapshot.router,
            probe: &probe,
            body: &read,
            fleet_spend,
        };
        let limit = self.reserve(ctx, asking).await?;
        // A stream that runs past the output held (an upstream that ignores the limit) is cut.
        let cut_at = ctx
            .reservation
            .as_ref()
            .filter(|_| super::reserve::output_field(path).is_some())
            .map(|r| r.output);
        let upstream = Upstream { limit, cut_at };
        prepare_upstream(
            &self.shared.store,
            ctx,
            &key,
            endpoint,
            route,
            &snapshot.router,
            probe,
            read,
            upstream,
        )
    }

    /// The key may use the endpoint and has budget left (a call that spends nothing needs none).
    fn permit(&self, key: &Key, endpoint: Endpoint, fleet_spend: Option<f64>) -> Result<(), Stop> {
        if !key.may_use(endpoint.group) {
            return Err(denied_endpoint(endpoint.group).into());
        }
        if endpoint.metering == Metering::Free {
            return Ok(());
        }
        // The fleet's figure from Redis, or this gateway's (its own costs and the store's
        // totals): whichever is higher, so a Redis that came back empty lets no spent key on.
        let exhausted = match (key.budget, fleet_spend) {
            (Some(budget), Some(spent)) => {
                crate::limit::budget::reached(spent.max(self.shared.spend.get(&key.id)), budget)
            }
            _ => self.shared.spend.exhausted(key),
        };
        if exhausted {
            return Err(GatewayError::InsufficientBalance.into());
        }
        Ok(())
    }

    /// Admits the request under the key's rpm/tpm/concurrency, across the fleet when
    /// `[limits] redis` is set. Returns the key's spend across the fleet when Redis told it.
    async fn limit(&self, key: &Key, ctx: &mut Ctx) -> Result<Option<f64>, Stop> {
        let limited = key.rpm.is_some()
            || key.tpm.is_some()
            || key.max_concurrent.is_some()
            || key.budget.is_some();
        if let Some(shared) = self.shared.shared_limits.as_ref().filter(|_| limited) {
            if shared.usable() {
                if let Ok(d) = shared.admit(key, &ctx.request_id).await {
                    ctx.headroom = d.headroom;
                    ctx.lease = d.lease;
                    return match d.refusal {
                        None => Ok(Some(d.spend)),
                        Some(r) => Err(refused(r)),
                    };
                }
            }
            self.shared.metrics.limits_fallback.inc();
            if shared.on_down == OnDown::Deny {
                return Err(GatewayError::LimiterUnavailable.into());
            }
        }
        let (admitted, headroom) = self.shared.limiter.admit(key, std::time::Instant::now());
        ctx.headroom = headroom;
        match admitted {
            Ok(slot) => {
                ctx.slot = slot;
                Ok(None)
            }
            Err(r) => Err(refused(r)),
        }
    }
}

fn refused(r: Refusal) -> Stop {
    r.into_error().into()
}

impl Gateway {
    /// The key of the request. An address that presented too many wrong keys is refused
    /// before its key is looked at; each wrong key counts against it.
    fn authenticate(
        &self,
        keys: &KeyTable,
        session: &Session,
        ctx: &mut Ctx,
    ) -> Result<Arc<Key>, Stop> {
        let client = ctx.client;
        // Anthropic's clients send the key in `x-api-key`; elsewhere only `Authorization:
        // Bearer` carries it (the contract).
        let anthropic = ctx.shape == crate::error::ErrorShape::Anthropic;
        let token = auth::presented(&session.req_header().headers, anthropic)?;
        let throttle = &self.shared.web.throttle;
        // Key expiry is judged at the request's arrival (no second clock read).
        let now_unix = ctx.time_ms.div_euclid(1000);
        let key = auth::authenticate_guarded(
            keys,
            throttle,
            client,
            token,
            now_unix,
            &self.shared.metrics,
        )?;
        ctx.key = Some(key.clone());
        Ok(key)
    }
}

/// What the request is, from method and path; a key in the URL is refused before anything.
fn target(session: &Session, ctx: &mut Ctx, keys: &KeyTable) -> Result<Target, Stop> {
    let req = session.req_header();
    ctx.shape = crate::route::endpoint::error_shape(req.uri.path(), &req.headers);
    let target = classify(&req.method, req.uri.path());
    // A path that is not the API's, or one the `other` group would send on as it is, must not
    // carry a key: not repeated in the 404, not sent upstream.
    let path_key = |path| {
        matches!(
            target,
            Target::Other
                | Target::StoredResponse(_)
                | Target::Proxy(Endpoint {
                    group: Group::Other,
                    ..
                })
        ) && auth::mentions_secret(keys, path)
    };
    if path_key(req.uri.path()) {
        return Err(GatewayError::NotFound(format!("/v1/{REDACTED}")).into());
    }
    let upstream_bound = matches!(target, Target::Proxy(_) | Target::StoredResponse(_));
    // Headers that go on upstream are bounded (see `MAX_HEADERS`).
    if upstream_bound {
        let count = req.headers.len();
        let bytes: usize = req
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len())
            .sum();
        if count > crate::error::MAX_HEADERS || bytes > crate::error::MAX_HEADER_BYTES {
            return Err(GatewayError::HeadersTooLarge(count, bytes).into());
        }
    }
    // Sent on as written, a path must mean to the upstream what it means here (also one the
    // API names for another method).
    if (upstream_bound || matches!(target, Target::WrongMethod(_)))
        && !crate::route::endpoint::canonical(req.uri.path())
    {
        let message = format!(
            "The path '{}' is not written as the API names it: no percent-encoded letters, \
             digits or '/', and no empty, '.' or '..' segments.",
            crate::web::params::shown(req.uri.path())
        );
        return Err(GatewayError::InvalidParameter {
            param: "path",
            message,
        }
        .into());
    }
    match target {
        Target::Other => return Err(GatewayError::NotFound(req.uri.path().to_string()).into()),
        Target::WrongMethod(allow) => return Err(GatewayError::MethodNotAllowed(allow).into()),
        _ => {}
    }
    // Known from the path alone, so a refusal by the limits still records its group.
    ctx.group = match &target {
        Target::Proxy(ep) => ep.group.name(),
        _ => Group::Models.name(),
    };
    if auth::key_in_query(req.uri.query(), keys) {
        let message =
            "Keys are read only from 'Authorization: Bearer' or 'x-api-key', never from the URL.";
        return Err(GatewayError::InvalidParameter {
            param: "api_key",
            message: message.into(),
        }
        .into());
    }
    Ok(target)
}

/// What stands in for a key a client pasted where it does not belong.
const REDACTED: &str = "[redacted]";

/// `/v1/responses/{id}`: the Responses group; no model in the body, no tokens.
const STORED_RESPONSE: Endpoint = Endpoint {
    group: Group::Responses,
    body: BodyKind::Json,
    metering: Metering::Free,
    api: Some(crate::route::endpoint::Api::Responses),
};

/// Sends a stored-response call to the upstream that made the response: the one remembered
/// for this key, or, when the gateway has a single upstream, that one.
fn route_stored(
    stored: &StoredResponses,
    router: &Router,
    key: &Key,
    id: &str,
    ctx: &mut Ctx,
    body: Bytes,
) -> Result<(), Stop> {
    let not_found = || Stop::Refuse(GatewayError::ResponseNotFound(id.to_string()));
    let (route, upstream) = match stored.find(id, &key.id) {
        Some(origin) => {
            let route = router
                .get(&origin.model)
                .filter(|r| r.pool.name == origin.pool)
                .ok_or_else(not_found)?;
            let i = route
                .pool
                .upstreams
                .iter()
                .position(|u| u.cfg.url == origin.upstream)
                .ok_or_else(not_found)?;
            (route.clone(), i)
        }
        None => {
            let single = router.pools.len() == 1
                && router.pools.first().is_some_and(|p| p.upstreams.len() == 1);
            let route = router
                .ordered
                .iter()
                .find(|r| single && key.may_use_model(&r.model.name))
                .ok_or_else(not_found)?;
            (route.clone(), 0)
        }
    };
    ctx.model = route.model.name.clone();
    ctx.meter = Meter::None;
    ctx.free = true; // STORED_RESPONSE's Metering::Free
    ctx.body = body;
    ctx.pinned = Some(upstream);
    ctx.asked = Some(route.clone());
    ctx.route = Some(route);
    ctx.proxied = true;
    Ok(())
}

fn denied_endpoint(group: Group) -> GatewayError {
    GatewayError::PermissionDenied {
        param: "endpoint",
        message: format!("This key may not use the '{}' endpoints.", group.name()),
    }
}

/// `GET /v1/models` and `/v1/models/{id}`, answered from the config and the key's permissions.
async fn answer_models(
    session: &mut Session,
    ctx: &mut Ctx,
    key: &Key,
    router: &Router,
    keys: &KeyTable,
    target: Target,
) -> Stop {
    if !key.may_use(Group::Models) {
        return denied_endpoint(Group::Models).into();
    }
    let body = match target {
        Target::GetModel(id) => match models::get(router, key, &id, ctx.shape) {
            Some(body) => body,
            // A key pasted as the id is not repeated back.
            None if auth::is_secret(keys, &id) => {
                return GatewayError::ModelNotFound(REDACTED.into()).into();
            }
            None => return GatewayError::ModelNotFound(id).into(),
        },
        _ => models::list(router, key, ctx.shape),
    };
    match respond::json(session, ctx, 200, body).await {
        Ok(()) => Stop::Answered,
        Err(e) => Stop::Io(e),
    }
}

fn permit_endpoint(key: &Key, endpoint: Endpoint, ctx: &mut Ctx) -> Result<(), Stop> {
    ctx.group = endpoint.group.name();
    if !key.may_use(endpoint.group) {
        return Err(denied_endpoint(endpoint.group).into());
    }
    Ok(())
}

/// Reads the whole body before any upstream; a client waiting for `100 Continue` gets it now
/// (only once its key has passed, and its permission and budget but on an `other` path; never
/// an HTTP/1.0 client, which knows no interim replies, RFC 9110 §10.1.1).
async fn read_body(
    session: &mut Session,
    ctx: &mut Ctx,
    shared: &super::Shared,
) -> Result<Bytes, Stop> {
    let config = &shared.live.fixed;
    if let Some(e) = body::refuse_unread(session, config.limits.max_body_bytes) {
        return Err(e.into());
    }
    ctx.body_asked = true;
    if body::expects_continue(session) {
        // The body is read whole after it (or the connection ends on a failed read): the
        // interim reply must not turn keep-alive off as an early answer would.
        let downstream = session.as_downstream_mut();
        downstream.set_close_on_response_before_downstream_finish(false);
        let bound = ctx.bound();
        let written =
            crate::http1::respond::bounded(bound, downstream.write_continue_response()).await;
        session
            .as_downstream_mut()
            .set_close_on_response_before_downstream_finish(true);
        written?;
    }
    let limit = config.server.client_body_timeout;
    let timed_out = |_| GatewayError::RequestTimeout(limit.as_millis() as u64);
    let read = {
        let read = tokio::time::timeout(limit, body::read(session, config.limits.max_body_bytes));
        let mut read = std::pin::pin!(read);
        // A body that has not all come yet: the request's journal entry is written before the
        // wait (a crash meanwhile leaves its record).
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx))).await;
        match first {
            std::task::Poll::Ready(r) => r.map_err(timed_out),
            std::task::Poll::Pending => {
                journal_written(&shared.store, ctx).await;
                // A slow upload does not hold a shutdown's exit (and its record) back either.
                tokio::select! {
                    r = read => r.map_err(timed_out),
                    () = crate::ops::lifecycle::cut(ctx.life.as_ref().map(InFlight::get)) => {
                        Err(GatewayError::ShuttingDown)
                    }
                }
            }
        }
    };
    match read {
        Ok(read) => Ok(read??),
        Err(e) => {
            // The rest of the body may still come: this connection cannot carry another request.
            session.as_downstream_mut().set_keepalive(None);
            Err(e.into())
        }
    }
}

async fn probe(
    session: &Session,
    endpoint: Endpoint,
    body: &Bytes,
) -> Result<route_body::Probe, GatewayError> {
    let content_type = session.req_header().headers.get(http::header::CONTENT_TYPE);
    let boundary = content_type
        .and_then(|v| v.to_str().ok())
        .and_then(route_body::multipart_boundary);
    match (endpoint.body, boundary) {
        // Boxed: the multipart parser's future (2 KB) is no part of a JSON request's.
        (BodyKind::MultipartOrJson, Some(b)) => {
            Box::pin(route_body::probe_multipart(body, &b)).await
        }
        _ => route_body::probe_json(body),
    }
}

/// The route of the model a request names (see `route_model`), its id in `ctx.model`.
fn routed(
    ctx: &mut Ctx,
    snapshot: &crate::route::live::Snapshot,
    key: &Key,
    model: &str,
) -> Result<Arc<Route>, Stop> {
    let found = match route_model(&snapshot.router, key, model) {
        // A key pasted as the model is neither repeated nor kept in the record.
        Err(Stop::Refuse(GatewayError::ModelNotFound(_)))
            if auth::mentions_secret(&snapshot.keys, model) =>
        {
            ctx.model = REDACTED.into();
            return Err(GatewayError::ModelNotFound(REDACTED.into()).into());
        }
        routed => routed?,
    };
    // Recorded, metered and priced as the id it is served as.
    if let Some(id) = found.id {
        ctx.model = id;
    }
    Ok(found.route)
}

/// The model's route (or its default's, when no entry matches it: the key's, else
/// `[routing]`'s), if the key may use it; the route and the id it is served as.
fn route_model(router: &Router, key: &Key, model: &str) -> Result<Found, Stop> {
    let Some(found) = router.resolve(model, key.default_model.as_deref()) else {
        return Err(GatewayError::ModelNotFound(model.to_string()).into());
    };
    // An alias is checked as asked (or by its model's name); a default model by its own id.
    let asked = match &found.id {
        Some(id) if found.route.model.aliases.iter().all(|a| a != model) => id,
        _ => model,
    };
    if !super::models::may_see(key, asked, &found.route) {
        return Err(GatewayError::PermissionDenied {
            param: "model",
            message: format!("This key may not use the model '{asked}'."),
        }
        .into());
    }
    Ok(found)
}

/// What the reservation changes in the upstream request: its output limit (with the
/// field to write it to), and the output after which a stream is cut.
struct Upstream {
    limit: Option<(u64, &'static str)>,
    cut_at: Option<u64>,
}

/// Opens the request's journal entry if its key passed auth and it has none yet, with what it
/// sends upstream when known; an entry opened before gets that as a line of its own.
fn journal(store: &crate::store::Store, ctx: &mut Ctx, sent: Option<SentRef<'_>>) {
    let Some(key) = ctx.key.as_ref() else {
        return;
    };
    match ctx.journal.as_mut() {
        Some(entry) => {
            if let Some(sent) = sent {
                entry.sent(&ctx.request_id, sent);
            }
        }
        None => {
            let entry = store.journal_open(crate::store::journal::OpenedRef {
                time_ms: ctx.time_ms,
                request_id: &ctx.request_id,
                key_id: &key.id,
                listener: ctx.listener.name(),
                endpoint: ctx.group,
                sent,
            });
            ctx.journal = entry;
        }
    }
}

/// `journal` without what the request sends, and returns once the entry's lines are written.
async fn journal_written(store: &crate::store::Store, ctx: &mut Ctx) {
    journal(store, ctx, None);
    if let Some(entry) = &ctx.journal {
        entry.durable().await;
    }
}

/// What the request sends upstream, for its journal entry: a crash that ends it then bills its
/// prompt, estimated as the tokenizer's fallback does (about four bytes a token of the body's
/// text), and the request's price.
fn sent_upstream<'a>(
    model: &'a str,
    stream: bool,
    endpoint: Endpoint,
    route: &Route,
    body: &[u8],
) -> SentRef<'a> {
    let by_tokens = matches!(
        endpoint.metering,
        Metering::Chat | Metering::Responses | Metering::Messages | Metering::Usage
    );
    let prompt_tokens = if by_tokens {
        crate::meter::estimate::rough_json_text(body)
    } else {
        0
    };
    let usage = crate::meter::Usage {
        prompt_tokens,
        total_tokens: prompt_tokens,
        ..Default::default()
    };
    let served = endpoint.metering != Metering::Free;
    SentRef {
        model,
        stream,
        prompt_tokens,
        cost: super::record::cost(&route.model.price, &usage, served),
    }
}

/// The meter, the body as the upstream will get it, and the upstream that gets it.
#[allow(clippy::too_many_arguments)]
fn prepare_upstream(
    store: &crate::store::Store,
    ctx: &mut Ctx,
    key: &Key,
    endpoint: Endpoint,
    route: Arc<Route>,
    router: &Router,
    probe: route_body::Probe,
    body: Bytes,
    upstream: Upstream,
) -> Result<(), Stop> {
    ctx.free = endpoint.metering == Metering::Free;
    ctx.asked = Some(route.clone());
    let model = std::mem::take(&mut ctx.model);
    // Its prompt's rough count is made only for a journal entry.
    if store.journals() {
        let sent = sent_upstream(&model, ctx.stream, endpoint, &route, &body);
        journal(store, ctx, Some(sent));
    }
    ctx.model = model;
    let sending = Sending {
        endpoint,
        body,
        probe,
        limit: upstream.limit,
        cut_at: upstream.cut_at,
    };
    let id = ctx.model.clone();
    super::sending::for_route(ctx, &sending, &route, &id)?;
    // Only models the key may use: a fallback is not a way around its allow-list (nor onto a
    // dearer model it was kept from).
    let fallbacks: Vec<Arc<Route>> = route
        .model
        .fallbacks
        .iter()
        .filter(|m| key.may_use_model(m))
        .filter_map(|m| router.get(m).cloned())
        .collect();
    // Every upstream of every pool that could take it down: say so at once.
    let routes = std::iter::once(&route).chain(&fallbacks);
    if !routes.into_iter().any(|r| r.pool.has_healthy(&[])) {
        return Err(GatewayError::NoHealthyUpstream(route.pool.name.clone()).into());
    }
    if !fallbacks.is_empty() {
        ctx.fallbacks = Some(Box::new(Fallbacks {
            routes: fallbacks,
            sending,
        }));
    }
    ctx.route = Some(route);
    ctx.proxied = true;
    Ok(())
}
