//! The proxy: `Gateway` implements Pingora's `ProxyHttp`. Each phase is a few lines that call
//! a stage: auth → permissions and budget → body and route → upstream → reply (metered) →
//! usage record. Refusals are answered in `request_filter` before any upstream is touched.

pub mod body;
pub mod ctx;
mod direct;
mod models;
pub mod record;
pub mod reply;
pub mod respond;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::connectors::http::Connector;
use pingora_core::modules::http::HttpModules;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::auth;
use crate::error::GatewayError;
use crate::limit::rate::retry_after_secs;
use crate::meter::Meter;
use crate::meter::sse::SseMeter;
use crate::route::body as route_body;
use crate::route::endpoint::{BodyKind, Endpoint, Group, Target, classify};
use crate::state::Shared;
use crate::upstream;
use crate::web;
use ctx::{Ctx, Listener};

pub struct Gateway {
    shared: Arc<Shared>,
    listener: Listener,
    /// Our own upstream client, for bodies Pingora's pipe cannot carry (see body.rs).
    connector: Connector,
}

impl Gateway {
    pub fn new(shared: Arc<Shared>, listener: Listener) -> Gateway {
        Gateway {
            shared,
            listener,
            connector: Connector::new(None),
        }
    }

    /// Decides the request. `Ok(true)`: answered here; `Ok(false)`: proxy it.
    async fn admit(&self, session: &mut Session, ctx: &mut Ctx) -> pingora_error::Result<bool> {
        let live = &self.shared.live;
        let req = session.req_header();
        if web::owns(req.uri.path()) {
            return self.web(session, ctx).await;
        }
        let target = classify(&req.method, req.uri.path());
        if target == Target::Other {
            let path = req.uri.path().to_string();
            respond::error(session, ctx, &GatewayError::NotFound(path)).await?;
            return Ok(true);
        }
        // Known from the path alone, so a refusal by the limits still records its group.
        ctx.group = match &target {
            Target::Proxy(ep) => ep.group.name(),
            _ => Group::Models.name(),
        };
        if auth::key_in_query(req.uri.query()) {
            let message =
                "Keys are read only from 'Authorization: Bearer', never from the URL.".into();
            return refuse(
                session,
                ctx,
                GatewayError::InvalidParameter {
                    param: "api_key",
                    message,
                },
            )
            .await;
        }
        let authorization = req
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let key = match auth::authenticate(&live.keys.load(), authorization, now_unix()) {
            Ok(k) => k,
            Err(e) => return refuse(session, ctx, e).await,
        };
        ctx.key = Some(key.clone());
        let (admitted, headroom) = self.shared.limiter.admit(&key, std::time::Instant::now());
        ctx.headroom = headroom;
        match admitted {
            Ok(slot) => ctx.slot = slot,
            Err(r) => {
                let e = GatewayError::RateLimited {
                    message: r.message,
                    retry_after: retry_after_secs(r.retry_after),
                };
                return refuse(session, ctx, e).await;
            }
        }
        let router = live.router.load_full();
        let endpoint = match target {
            Target::ListModels | Target::GetModel(_) => {
                ctx.group = Group::Models.name();
                if !key.may_use(Group::Models) {
                    return refuse(session, ctx, denied_endpoint(Group::Models)).await;
                }
                match target {
                    Target::GetModel(id) => match models::get(&router, &key, &id) {
                        Some(body) => respond::json(session, ctx, 200, body).await?,
                        None => {
                            respond::error(session, ctx, &GatewayError::ModelNotFound(id)).await?
                        }
                    },
                    _ => respond::json(session, ctx, 200, models::list(&router, &key)).await?,
                }
                return Ok(true);
            }
            Target::Proxy(ep) => ep,
            Target::Other => return Ok(true),
        };
        ctx.endpoint = Some(endpoint);
        ctx.group = endpoint.group.name();
        if !key.may_use(endpoint.group) {
            return refuse(session, ctx, denied_endpoint(endpoint.group)).await;
        }
        // The body is read here, before any upstream: a client waiting for 100 Continue gets it
        // now (only once its key has passed).
        if session
            .req_header()
            .headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
        {
            session
                .as_downstream_mut()
                .write_continue_response()
                .await?;
        }
        let read = match body::read(session, live.config.max_body_bytes).await? {
            Ok(r) => r,
            Err(e) => return refuse(session, ctx, e).await,
        };
        let probe = match probe(session, endpoint, &read.bytes).await {
            Ok(p) => p,
            Err(e) => return refuse(session, ctx, e).await,
        };
        ctx.model = probe.model.clone();
        ctx.stream = probe.stream;
        let Some(route) = router.get(&probe.model).cloned() else {
            return refuse(session, ctx, GatewayError::ModelNotFound(probe.model)).await;
        };
        if !key.may_use_model(&probe.model) {
            let message = format!("This key may not use the model '{}'.", probe.model);
            return refuse(
                session,
                ctx,
                GatewayError::PermissionDenied {
                    param: "model",
                    message,
                },
            )
            .await;
        }
        if self.shared.spend.exhausted(&key) {
            return refuse(session, ctx, GatewayError::InsufficientBalance).await;
        }
        // Streams are metered from their events; ask the upstream for usage if the client
        // did not (and hide it from the client again, see meter/sse.rs).
        let metering = crate::meter::enabled();
        let ask_usage =
            metering && probe.stream && endpoint.group == Group::Chat && !probe.include_usage;
        ctx.meter = match endpoint.group {
            _ if !metering => Meter::None,
            Group::Chat if probe.stream => Meter::Sse(SseMeter::new(ask_usage)),
            Group::Chat | Group::Embeddings | Group::Moderations => Meter::json(),
            _ => Meter::None,
        };
        let rename = route
            .renames()
            .then_some(route.model.upstream_model.as_str());
        ctx.body = route_body::for_upstream(&read.bytes, &probe, rename, ask_usage);
        let Some(up) = route.pool.pick() else {
            return refuse(
                session,
                ctx,
                GatewayError::NoHealthyUpstream(route.pool.name.clone()),
            )
            .await;
        };
        ctx.upstream = route
            .pool
            .upstreams
            .iter()
            .position(|u| std::ptr::eq(u, up))
            .unwrap_or(0);
        ctx.route = Some(route);
        ctx.router = Some(router);
        ctx.proxied = true;
        if !read.via_pingora {
            direct::forward(&self.connector, session, ctx).await;
            return Ok(true);
        }
        Ok(false)
    }
}

impl Gateway {
    /// Hands a non-proxied path to the web stage; a key that passed auth there makes the
    /// request leave its usage record (group `usage`) like any other.
    async fn web(&self, session: &mut Session, ctx: &mut Ctx) -> pingora_error::Result<bool> {
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let mut ex = web::Exchange {
            request_id: ctx.request_id.clone(),
            listener: self.listener,
            client,
            key: None,
            status: 0,
        };
        let sent = web::serve(&self.shared, session, &mut ex).await;
        ctx.key = ex.key;
        ctx.status = ex.status;
        ctx.group = Group::Usage.name();
        sent.map(|()| true)
    }
}

async fn refuse(
    session: &mut Session,
    ctx: &mut Ctx,
    e: GatewayError,
) -> pingora_error::Result<bool> {
    respond::error(session, ctx, &e).await?;
    Ok(true)
}

fn denied_endpoint(group: Group) -> GatewayError {
    GatewayError::PermissionDenied {
        param: "endpoint",
        message: format!("This key may not use the '{}' endpoints.", group.name()),
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
        (BodyKind::MultipartOrJson, Some(b)) => route_body::probe_multipart(body, &b).await,
        _ => route_body::probe_json(body),
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The route and upstream chosen in `admit`; Pingora only calls the upstream phases after it.
fn chosen(ctx: &Ctx) -> pingora_error::Result<(&crate::route::Pool, &crate::route::Upstream)> {
    let pool = &ctx
        .route
        .as_ref()
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route"))?
        .pool;
    let up = pool
        .upstreams
        .get(ctx.upstream)
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "no upstream"))?;
    Ok((pool, up))
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::new(self.listener)
    }

    /// No response compression: the reply goes through as the upstream sent it.
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora_error::Result<bool> {
        self.admit(session, ctx).await
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora_error::Result<Box<HttpPeer>> {
        let (pool, up) = chosen(ctx)?;
        Ok(upstream::peer(pool, up))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> pingora_error::Result<()> {
        let (pool, up) = chosen(ctx)?;
        upstream::rewrite_request(req, pool, up, ctx.body.len(), &ctx.request_id)
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> pingora_error::Result<()> {
        // Pingora hands over the retry buffer's tail (see body.rs); send the whole body instead.
        *body = (end_of_stream && !ctx.body.is_empty()).then(|| ctx.body.clone());
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> pingora_error::Result<()> {
        reply::on_upstream_header(ctx, resp)
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> pingora_error::Result<Option<std::time::Duration>> {
        reply::on_body(ctx, body, end_of_stream);
        Ok(None)
    }

    /// A client that goes away is normal traffic, not an error worth a log line.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, error: &Error) -> bool {
        error.esource() == &ErrorSource::Downstream
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let failure = reply::classify_failure(e);
        let code = match (&failure, session.response_written()) {
            (Some(g), None) => {
                if let Err(we) = respond::json(session, ctx, g.status(), g.body()).await {
                    tracing::debug!(request_id = %ctx.request_id, "could not send the error: {we}");
                }
                g.status()
            }
            (Some(g), Some(_)) => g.status(),
            (None, _) => 499,
        };
        ctx.status = code;
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// Every request that passed auth leaves exactly one usage record, whatever its outcome.
    async fn logging(&self, _session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let Some(key) = ctx.key.clone() else { return };
        if let Some(e) = e {
            // A failure after the reply began (fail_to_proxy may not have run): a client that
            // went away is 499, an upstream that broke off is 502.
            if ctx.status == 0 || (200..300).contains(&ctx.status) {
                ctx.status = if e.esource() == &ErrorSource::Downstream {
                    499
                } else {
                    502
                };
            }
        }
        if let Some(m) = crate::metrics::get() {
            m.requests
                .with_label_values(&[ctx.listener.name(), ctx.group, &ctx.status.to_string()])
                .inc();
        }
        let r = record::build(ctx, &key.id);
        ctx.slot = None;
        self.shared
            .limiter
            .add_tokens(&key, r.total_tokens, std::time::Instant::now());
        self.shared.spend.add(&key.id, r.cost);
        self.shared.store.record(r);
    }
}
