//! The admin listener: `/healthz` (liveness), `/readyz` (readiness), `/metrics` (Prometheus
//! text) and `/upstreams` (each pool's upstreams and their health). Answers from the live
//! state only; never proxies.

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use pingora_core::services::listening::Service;

use crate::proxy::Shared;

pub struct Admin {
    shared: Arc<Shared>,
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        let (status, content_type, body) = match path.as_str() {
            "/healthz" => (
                200,
                "application/json",
                format!(
                    "{{\"status\":\"ok\",\"keys\":{},\"models\":{}}}",
                    self.shared.live.snapshot().keys.len(),
                    self.shared.live.snapshot().router.ordered.len()
                ),
            ),
            "/upstreams" => (200, "application/json", self.upstreams()),
            "/readyz" => self.readiness(),
            "/metrics" => (200, "text/plain; version=0.0.4", {
                let m = &self.shared.metrics;
                let snapshot = self.shared.live.snapshot();
                let upstreams = snapshot.router.upstream_gauges();
                if let Some(log) = &self.shared.access_log {
                    m.access_log_dropped(log.dropped());
                }
                m.render(self.shared.store.stats(), &upstreams)
            }),
            _ => (
                404,
                "application/json",
                String::from_utf8(crate::error::GatewayError::NotFound(path).body())
                    .unwrap_or_default(),
            ),
        };
        Response::builder()
            .status(status)
            .header("content-type", content_type)
            .header("content-length", body.len())
            .body(body.into_bytes())
            .unwrap_or_default()
    }
}

impl Admin {
    /// Ready only when keys are loaded, the store is writing and every pool has a healthy
    /// upstream; otherwise 503 with every reason. From a shutdown's signal on, 503 `draining`.
    fn readiness(&self) -> (u16, &'static str, String) {
        if self.shared.lifecycle.draining() {
            let body = serde_json::json!({
                "status": "draining",
                "reasons": ["shutting down"],
            });
            return (503, "application/json", body.to_string());
        }
        let snapshot = self.shared.live.snapshot();
        let mut reasons = Vec::new();
        if snapshot.keys.is_empty() {
            reasons.push("no keys are loaded".to_string());
        }
        let store = self.shared.store.stats();
        if store.full {
            reasons.push(
                "the usage store is full: records wait in memory up to \
                 [storage] memory_max_records"
                    .to_string(),
            );
        } else if !self.shared.store.writable() {
            reasons.push("the usage store is failing to write".to_string());
        }
        for pool in &snapshot.router.pools {
            if !pool.has_healthy(&[]) {
                reasons.push(format!("pool '{}' has no healthy upstream", pool.name));
            }
        }
        if reasons.is_empty() {
            (200, "application/json", "{\"status\":\"ready\"}".into())
        } else {
            let body = serde_json::json!({ "status": "not ready", "reasons": reasons });
            (503, "application/json", body.to_string())
        }
    }

    /// Every pool's upstreams and how the gateway sees them right now.
    fn upstreams(&self) -> String {
        let snapshot = self.shared.live.snapshot();
        let now = crate::upstream::health::now_ms();
        let pools: Vec<serde_json::Value> = snapshot
            .router
            .pools
            .iter()
            .map(|pool| {
                let ups: Vec<serde_json::Value> = pool
                    .upstreams
                    .iter()
                    .map(|u| {
                        let (check_failed, cooldown_ms, inflight, requests, failures) =
                            u.health.view(now);
                        serde_json::json!({
                            "url": u.cfg.url,
                            "weight": u.cfg.weight,
                            "healthy": u.health.healthy(now),
                            "check_failed": check_failed,
                            "cooldown_remaining_ms": cooldown_ms,
                            "in_flight": inflight,
                            "requests": requests,
                            "failures": failures,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "name": pool.name,
                    "strategy": pool.cfg.strategy.name(),
                    "upstreams": ups,
                })
            })
            .collect();
        serde_json::json!({ "pools": pools }).to_string()
    }
}

pub fn service(
    addr: &str,
    shared: Arc<Shared>,
    options: Option<pingora_core::listeners::TcpSocketOptions>,
) -> Service<pingora_core::apps::http_app::HttpServer<Admin>> {
    let mut svc = Service::new(
        "modelgate admin".to_string(),
        pingora_core::apps::http_app::HttpServer::new_app(Admin { shared }),
    );
    match options {
        Some(o) => svc.add_tcp_with_settings(addr, o),
        None => svc.add_tcp(addr),
    }
    svc.threads = Some(1);
    svc
}
