//! The proxy: `Gateway` implements Pingora's `ProxyHttp`. Each phase is a few lines that call
//! a stage: auth → permissions → body and route → upstream → reply. Refusals are answered in
//! `request_filter` before any upstream is touched.

pub mod body;
pub mod ctx;
mod direct;
mod models;
pub mod reply;
pub mod respond;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::connectors::http::Connector;
use pingora_core::modules::http::HttpModules;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::auth;
use crate::config::live::Live;
use crate::error::GatewayError;
use crate::route::body as route_body;
use crate::route::endpoint::{BodyKind, Endpoint, Group, Target, classify};
use crate::upstream;
use ctx::{Ctx, Listener};

pub struct Gateway {
    live: Arc<Live>,
    listener: Listener,
    /// Our own upstream client, for bodies Pingora's pipe cannot carry (see body.rs).
    connector: Connector,
}

impl Gateway {
    pub fn new(live: Arc<Live>, listener: Listener) -> Gateway {
        Gateway {
            live,
            listener,
            connector: Connector::new(None),
        }
    }

    /// Decides the request. `Ok(true)`: answered here; `Ok(false)`: proxy it.
    async fn admit(&self, session: &mut Session, ctx: &mut Ctx) -> pingora_error::Result<bool> {
        let req = session.req_header();
        let target = classify(&req.method, req.uri.path());
        if target == Target::Other {
            let path = req.uri.path().to_string();
            respond::error(session, ctx, &GatewayError::NotFound(path)).await?;
            return Ok(true);
        }
        let authorization = req
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let key = match auth::authenticate(&self.live.keys.load(), authorization, now_unix()) {
            Ok(k) => k,
            Err(e) => return refuse(session, ctx, e).await,
        };
        ctx.key = Some(key.clone());
        let router = self.live.router.load_full();
        let endpoint = match target {
            Target::ListModels | Target::GetModel(_) if !key.may_use(Group::Models) => {
                return refuse(session, ctx, denied_endpoint(Group::Models)).await;
            }
            Target::ListModels => {
                let body = models::list(&router, &key);
                respond::json(session, ctx, 200, body).await?;
                return Ok(true);
            }
            Target::GetModel(id) => {
                match models::get(&router, &key, &id) {
                    Some(body) => respond::json(session, ctx, 200, body).await?,
                    None => respond::error(session, ctx, &GatewayError::ModelNotFound(id)).await?,
                }
                return Ok(true);
            }
            Target::Proxy(ep) => ep,
            Target::Healthz | Target::Other => return Ok(true),
        };
        ctx.endpoint = Some(endpoint);
        if !key.may_use(endpoint.group) {
            return refuse(session, ctx, denied_endpoint(endpoint.group)).await;
        }
        let read = match body::read(session, self.live.config.max_body_bytes).await? {
            Ok(r) => r,
            Err(e) => return refuse(session, ctx, e).await,
        };
        let probe = match probe(session, endpoint, &read.bytes).await {
            Ok(p) => p,
            Err(e) => return refuse(session, ctx, e).await,
        };
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
        ctx.body = if route.renames() {
            route_body::rewrite_model(&read.bytes, &probe, &route.model.upstream_model)
        } else {
            read.bytes
        };
        ctx.stream = probe.stream;
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
        if !read.via_pingora {
            direct::forward(&self.connector, session, ctx).await;
            return Ok(true);
        }
        Ok(false)
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
        error.esource() == &pingora_error::ErrorSource::Downstream
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
}
