//! The baseline of `benches/load.sh`: a bare Pingora 0.9 `ProxyHttp` that only names its
//! upstream (`upstream_peer`), with the same server settings as modelgate (one thread, no work
//! stealing, a large upstream keep-alive pool, no compression module). What modelgate adds
//! over it is the gateway's own cost.
//!
//! `cargo run --release --example bare_pingora -- LISTEN_ADDR UPSTREAM_ADDR [THREADS]`
//! (THREADS: 1 by default; more, with work stealing, as modelgate runs them)

use async_trait::async_trait;
use pingora_core::modules::http::HttpModules;
use pingora_core::server::Server;
use pingora_core::server::configuration::ServerConf;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};

struct Bare {
    upstream: std::net::SocketAddr,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora_error::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: bare_pingora LISTEN_ADDR UPSTREAM_ADDR [THREADS]");
        std::process::exit(2);
    };
    let Ok(upstream) = upstream.parse() else {
        eprintln!("UPSTREAM_ADDR must be ip:port");
        std::process::exit(2);
    };
    let threads = match args.next().map(|t| t.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("THREADS must be a number from 1");
            std::process::exit(2);
        }
    };
    let conf = ServerConf {
        threads,
        work_stealing: threads > 1,
        upstream_keepalive_pool_size: 4096,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora_proxy::http_proxy_service(&server.configuration, Bare { upstream });
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever();
}
