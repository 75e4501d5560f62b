//! The admin listener: `/healthz` for probes (and, later, `/metrics`). Answers from the live
//! state only; never proxies.

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use pingora_core::services::listening::Service;

use crate::config::live::Live;

pub struct Admin {
    live: Arc<Live>,
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        let (status, body) = match path.as_str() {
            "/healthz" => (
                200,
                format!(
                    "{{\"status\":\"ok\",\"keys\":{},\"models\":{}}}",
                    self.live.keys.load().len(),
                    self.live.router.load().ordered.len()
                ),
            ),
            _ => (
                404,
                String::from_utf8(crate::error::GatewayError::NotFound(path).body())
                    .unwrap_or_default(),
            ),
        };
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .header("content-length", body.len())
            .body(body.into_bytes())
            .unwrap_or_default()
    }
}

pub fn service(
    addr: &str,
    live: Arc<Live>,
) -> Service<pingora_core::apps::http_app::HttpServer<Admin>> {
    let mut svc = Service::new(
        "modelgate admin".to_string(),
        pingora_core::apps::http_app::HttpServer::new_app(Admin { live }),
    );
    svc.add_tcp(addr);
    svc.threads = Some(1);
    svc
}
