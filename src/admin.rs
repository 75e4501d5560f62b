//! The admin listener: `/healthz` for probes and `/metrics` (Prometheus text). Answers from the live
//! state only; never proxies.

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use pingora_core::services::listening::Service;

use crate::state::Shared;

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
            "/metrics" => (
                200,
                "text/plain; version=0.0.4",
                crate::metrics::get()
                    .map(|m| m.render(self.shared.store.stats()))
                    .unwrap_or_default(),
            ),
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

pub fn service(
    addr: &str,
    shared: Arc<Shared>,
) -> Service<pingora_core::apps::http_app::HttpServer<Admin>> {
    let mut svc = Service::new(
        "modelgate admin".to_string(),
        pingora_core::apps::http_app::HttpServer::new_app(Admin { shared }),
    );
    svc.add_tcp(addr);
    svc.threads = Some(1);
    svc
}
