//! Builds the Pingora server: the `main` and `direct` API listeners sharing one live state, the
//! `admin` listener, and in the demo the mock upstream in the same process.

use std::sync::Arc;

use pingora_core::server::Server;
use pingora_core::server::configuration::ServerConf;
use pingora_core::services::listening::Service;
use pingora_proxy::http_proxy;

use crate::admin;
use crate::config::reload::KeysReloader;
use crate::lifecycle::Drain;
use crate::listener::HeaderDeadline;
use crate::mock_upstream;
use crate::proxy::Gateway;
use crate::proxy::ctx::Listener;
use crate::route::health::HealthChecker;
use crate::state::Shared;
use crate::tls::{CertReloader, ListenerCert};

/// The server, or why it cannot start (a listener's certificate that cannot be loaded).
pub fn build(shared: Arc<Shared>, upgrade: bool) -> Result<Server, String> {
    let config = shared.live.config.clone();
    let conf = ServerConf {
        threads: config.threads,
        // One thread per service: a current-thread runtime, no cross-thread wake-ups
        // (pingora-perf-notes.md §1). With more threads, work stealing keeps them balanced.
        work_stealing: config.threads > 1,
        // The drain service (lifecycle.rs) ends the process once requests are done; Pingora's
        // own grace period is only the backstop behind it.
        grace_period_seconds: Some(config.grace_period_seconds + 10),
        graceful_shutdown_timeout_seconds: Some(5),
        // Pingora's own upstream pool, for its proxy path; modelgate forwards through its
        // own connections (upstream::pool), capped the same.
        upstream_keepalive_pool_size: 4096,
        upgrade_sock: config.upgrade_sock.display().to_string(),
        ..ServerConf::default()
    };
    let opt = pingora_core::server::configuration::Opt {
        upgrade,
        ..Default::default()
    };
    let mut server = Server::new_with_opt_and_conf(Some(opt), conf);
    server.bootstrap();

    if let Some(addr) = &config.demo_mock_upstream {
        match mock_upstream::service(addr, mock_upstream::MockOptions::default()) {
            Ok(svc) => {
                server.add_service(svc);
            }
            Err(e) => tracing::error!("demo mock upstream not started on {addr}: {e}"),
        }
    }
    let mut certs = Vec::new();
    for (listener, addr, tls) in [
        (
            Listener::Main,
            &config.listeners.main,
            &config.listeners.main_tls,
        ),
        (
            Listener::Direct,
            &config.listeners.direct,
            &config.listeners.direct_tls,
        ),
    ] {
        if let Some(addr) = addr {
            let name = format!("modelgate {}", listener.name());
            let mut proxy = http_proxy(
                &server.configuration,
                Gateway::new(shared.clone(), listener),
            );
            // An idle HTTP/2 connection is closed as an idle HTTP/1.1 one is.
            let mut options = pingora_core::apps::HttpServerOptions::default();
            options.h2_idle_timeout = Some(config.keepalive_timeout);
            proxy.server_options = Some(options);
            let app = HeaderDeadline {
                inner: Arc::new(proxy),
                limit: config.client_header_timeout,
                listener: listener.name(),
            };
            let mut svc = Service::new(name, app);
            match tls {
                // No L4 read buffer: Pingora reads a request's header into a buffer of its
                // own, and the 64 KiB one under it (its first page written by every request)
                // stayed for the connection's life, a kept-alive one's and a stream's too. TLS
                // keeps it: the TLS layer reads in records of its size. No L4 write buffer
                // either: `listener::Deadlined` gathers a reply's small writes itself, in a
                // buffer held only until they are out.
                None => svc.add_listener(
                    pingora_core::listeners::ListenerConfig::tcp(addr)
                        .l4_buffer(pingora_core::listeners::L4BufferSettings::unbuffered()),
                ),
                Some(files) => {
                    // The config stage loaded this pair already; it can only fail here if the
                    // files changed in between.
                    let cert = ListenerCert::new(listener.name(), files.clone())?;
                    svc.add_tls_with_settings(addr, None, cert.settings());
                    certs.push(cert);
                }
            }
            server.add_service(svc);
        }
    }
    if !certs.is_empty() {
        server.add_service(pingora_core::services::background::background_service(
            "tls certificate reload",
            CertReloader::new(certs),
        ));
    }
    server.add_service(pingora_core::services::background::background_service(
        "keys reload",
        KeysReloader::new(shared.live.clone()),
    ));
    server.add_service(pingora_core::services::background::background_service(
        "shutdown drain",
        Drain {
            lifecycle: shared.lifecycle.clone(),
            store: shared.store.clone(),
            grace: std::time::Duration::from_secs(config.grace_period_seconds),
        },
    ));
    server.add_service(pingora_core::services::background::background_service(
        "upstream health checks",
        HealthChecker::new(shared.live.clone(), config.demo_mock_upstream.clone()),
    ));
    if let Some(addr) = &config.listeners.admin {
        server.add_service(admin::service(addr, shared.clone()));
    }
    Ok(server)
}
