//! Builds the Pingora server: the `main` and `direct` API listeners as one service (one runtime
//! for both, one live state), the `admin` listener, and in the demo the mock upstream in the
//! same process.

pub mod admin;
pub mod drain;
pub mod ports;

use std::sync::Arc;

use pingora_core::apps::ServerApp;
use pingora_core::protocols::Stream;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::listening::Service;
use pingora_proxy::http_proxy;

use crate::config::Listener;
use crate::http1::listener::{HeaderDeadline, Hooks};
use crate::http1::tls::{CertReloader, ListenerCert};
use crate::mock_upstream;
use crate::proxy::Gateway;
use crate::proxy::Shared;
use crate::route::health::HealthChecker;
use crate::route::reload::KeysReloader;
use drain::Drain;

/// The server, or why it cannot start (a listener's certificate that cannot be loaded).
/// `picked`: the listen addresses whose port the gateway picked (`ports`), held by it.
pub fn build(shared: Arc<Shared>, upgrade: bool, picked: &ports::Picked) -> Result<Server, String> {
    let config = shared.live.fixed.clone();
    let conf = ServerConf {
        threads: config.server.threads,
        // One thread per service: a current-thread runtime, no cross-thread wake-ups
        // (pingora-perf-notes.md §1). With more threads, work stealing keeps them balanced.
        work_stealing: config.server.threads > 1,
        // The drain service (lifecycle.rs) ends the process once requests are done; Pingora's
        // own grace period is only the backstop behind it.
        grace_period_seconds: Some(config.server.grace_period_seconds + 10),
        graceful_shutdown_timeout_seconds: Some(5),
        // Pingora's own upstream pool, for its proxy path; modelgate forwards through its
        // own connections (upstream::pool), capped the same.
        upstream_keepalive_pool_size: 4096,
        upgrade_sock: config.server.upgrade_sock.display().to_string(),
        ..ServerConf::default()
    };
    let opt = pingora_core::server::configuration::Opt {
        upgrade,
        ..Default::default()
    };
    let mut server = Server::new_with_opt_and_conf(Some(opt), conf);
    server.bootstrap();

    if let Some(addr) = &config.demo_mock_upstream {
        // The demo's port may be held by whoever picked it for this process (a test harness).
        let opts = mock_upstream::MockOptions {
            reuse_port: true,
            ..Default::default()
        };
        match mock_upstream::service(addr, opts) {
            Ok(svc) => {
                server.add_service(svc);
            }
            Err(e) => tracing::error!("demo mock upstream not started on {addr}: {e}"),
        }
    }
    let certs = add_api_service(&mut server, &shared, picked)?;
    if !certs.is_empty() {
        server.add_service(pingora_core::services::background::background_service(
            "tls certificate reload",
            CertReloader::new(certs),
        ));
    }
    server.add_service(pingora_core::services::background::background_service(
        "keys reload",
        KeysReloader::new(shared.live.clone(), shared.metrics.clone()),
    ));
    server.add_service(pingora_core::services::background::background_service(
        "shutdown drain",
        Drain {
            lifecycle: shared.lifecycle.clone(),
            store: shared.store.clone(),
            grace: std::time::Duration::from_secs(config.server.grace_period_seconds),
            access_log: shared.access_log.clone(),
        },
    ));
    server.add_service(pingora_core::services::background::background_service(
        "upstream health checks",
        HealthChecker::new(
            shared.live.clone(),
            shared.metrics.clone(),
            config.demo_mock_upstream.clone(),
        ),
    ));
    if let Some(addr) = &config.listeners.admin {
        let options = socket_options(picked.has(addr));
        server.add_service(admin::service(addr, shared.clone(), options));
    }
    Ok(server)
}

/// The API listeners' apps, each with the address its listener is bound to: a connection goes
/// to the app of the listener that accepted it.
struct ApiListeners<A> {
    apps: Vec<(std::net::SocketAddr, Arc<A>)>,
}

impl<A> ApiListeners<A> {
    /// The app for a connection accepted on `local` (the first when there is one, or when the
    /// address is unknown).
    fn app_for(&self, local: impl FnOnce() -> Option<std::net::SocketAddr>) -> Option<&Arc<A>> {
        if self.apps.len() > 1 {
            if let Some(local) = local() {
                let found = self.apps.iter().find(|(b, _)| accepted_on(b, &local));
                if let Some((_, app)) = found {
                    return Some(app);
                }
            }
        }
        self.apps.first().map(|(_, app)| app)
    }
}

/// Whether a connection whose local address is `local` was accepted by a listener bound to
/// `bound`: the same port, and the same address or an unspecified one that covers it
/// (`0.0.0.0` IPv4 only; `[::]` every address, its IPv4 ones mapped). Config refuses two
/// listeners one port could serve both of, and port 0 with both on, so at most one matches.
fn accepted_on(bound: &std::net::SocketAddr, local: &std::net::SocketAddr) -> bool {
    let (b, l) = (bound.ip().to_canonical(), local.ip().to_canonical());
    // `0.0.0.0` takes IPv4 only; `[::]`, dual-stack as Pingora binds it, every address.
    let covers = b.is_unspecified() && (b.is_ipv6() || l.is_ipv4());
    bound.port() == local.port() && (b == l || covers)
}

#[async_trait::async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for ApiListeners<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let local = || {
            let digest = stream.get_socket_digest()?;
            digest.local_addr()?.as_inet().copied()
        };
        let app = self.app_for(local)?.clone();
        ServerApp::process_new(&app, stream, shutdown).await
    }

    async fn cleanup(&self) {
        for (_, app) in &self.apps {
            app.cleanup().await;
        }
    }
}

/// Both API listeners as one service (so one runtime of `threads` threads serves whichever
/// gets the traffic), each with its header deadline and, where configured, its TLS
/// certificate; returns the certificates, for their reload service.
fn add_api_service(
    server: &mut Server,
    shared: &Arc<Shared>,
    picked: &ports::Picked,
) -> Result<Vec<Arc<ListenerCert>>, String> {
    let config = shared.live.fixed.clone();
    let mut certs = Vec::new();
    let mut apps = ApiListeners { apps: Vec::new() };
    let mut svc_listeners = Vec::new();
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
        let Some(addr) = addr else { continue };
        let mut proxy = http_proxy(
            &server.configuration,
            Gateway::new(shared.clone(), listener),
        );
        // An idle HTTP/2 connection is closed as an idle HTTP/1.1 one is.
        let mut options = pingora_core::apps::HttpServerOptions::default();
        options.h2_idle_timeout = Some(config.server.keepalive_timeout);
        proxy.server_options = Some(options);
        let app = Arc::new(HeaderDeadline {
            inner: Arc::new(proxy),
            limit: config.server.client_header_timeout,
            listener: listener.name(),
            hooks: Hooks {
                request_started: crate::ops::alloc::request_started,
                unparseable: {
                    let metrics = shared.metrics.clone();
                    Arc::new(move |listener| crate::proxy::unparseable_reply(listener, &metrics))
                },
            },
        });
        let bound = addr
            .parse::<std::net::SocketAddr>()
            .map_err(|e| format!("listener {}: {addr}: {e}", listener.name()))?;
        apps.apps.push((bound, app));
        match tls {
            None => svc_listeners.push((addr.clone(), None)),
            Some(files) => {
                // The config stage loaded this pair already; it can only fail here if the
                // files changed in between.
                let cert =
                    ListenerCert::new(listener.name(), files.clone(), shared.metrics.clone())?;
                svc_listeners.push((addr.clone(), Some(cert.settings())));
                certs.push(cert);
            }
        }
    }
    if !apps.apps.is_empty() {
        let mut svc = Service::new("modelgate api".to_string(), apps);
        for (addr, tls) in svc_listeners {
            let options = socket_options(picked.has(&addr));
            match tls {
                // No L4 read buffer: Pingora reads a request's header into a buffer of its
                // own, and the 64 KiB one under it (its first page written by every request)
                // stayed for the connection's life, a kept-alive one's and a stream's too. TLS
                // keeps it: the TLS layer reads in records of its size. No L4 write buffer
                // either: `http1::listener::Deadlined` gathers a reply's small writes itself, in a
                // buffer held only until they are out.
                None => {
                    let mut l = pingora_core::listeners::ListenerConfig::tcp(&addr)
                        .l4_buffer(pingora_core::listeners::L4BufferSettings::unbuffered());
                    if let Some(o) = options {
                        l = l.tcp_socket_options(o);
                    }
                    svc.add_listener(l)
                }
                Some(settings) => svc.add_tls_with_settings(&addr, options, settings),
            }
        }
        server.add_service(svc);
    }
    Ok(certs)
}

/// `SO_REUSEPORT` for an address whose port the gateway picked and holds; else Pingora's
/// defaults.
fn socket_options(reuse_port: bool) -> Option<pingora_core::listeners::TcpSocketOptions> {
    reuse_port.then(|| {
        let mut o = pingora_core::listeners::TcpSocketOptions::default();
        o.so_reuseport = Some(true);
        o
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_goes_to_the_listener_that_accepted_it() {
        let a = |s: &str| s.parse::<std::net::SocketAddr>().expect("addr");
        for (bound, local, accepted) in [
            ("127.0.0.1:8080", "127.0.0.1:8080", true),
            ("127.0.0.1:8080", "127.0.0.1:8081", false),
            ("127.0.0.1:8080", "10.0.0.1:8080", false),
            ("0.0.0.0:8080", "10.0.0.1:8080", true),
            ("[::]:8080", "[::ffff:10.0.0.1]:8080", true),
            ("[::]:8080", "[::1]:8080", true),
            ("127.0.0.1:8080", "[::ffff:127.0.0.1]:8080", true),
            ("[::1]:8080", "127.0.0.1:8080", false),
            ("0.0.0.0:8080", "[::1]:8080", false),
            ("0.0.0.0:8080", "[2001:db8::1]:8080", false),
        ] {
            assert_eq!(
                accepted_on(&a(bound), &a(local)),
                accepted,
                "{bound} {local}"
            );
        }
        let apps = ApiListeners {
            apps: vec![
                (a("127.0.0.1:8080"), Arc::new("main")),
                (a("0.0.0.0:8081"), Arc::new("direct")),
            ],
        };
        let pick = |local: Option<&str>| **apps.app_for(|| local.map(a)).expect("an app");
        assert_eq!(pick(Some("127.0.0.1:8080")), "main");
        assert_eq!(pick(Some("10.1.2.3:8081")), "direct");
        assert_eq!(pick(None), "main");
    }
}
