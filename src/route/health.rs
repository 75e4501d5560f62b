//! Active health checks, a background service: every `health_interval_ms` each upstream of a
//! pool is asked `GET /v1/models` with its own credential. One that fails (no connection, no
//! reply within the check's deadline, or a status other than 2xx) leaves rotation until a check
//! passes; a pass also ends a passive cool-down early. Changes are logged once each.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_http::RequestHeader;

use super::Pool;
use super::live::Live;
use crate::upstream;
use crate::upstream::Upstream;

/// How often the service looks for pools whose check is due.
const TICK: Duration = Duration::from_millis(100);

pub struct HealthChecker {
    live: Arc<Live>,
    metrics: Arc<crate::ops::metrics::Metrics>,
    /// The demo upstream this process serves itself (`demo_mock_upstream`), if any.
    demo: Option<String>,
}

impl HealthChecker {
    pub fn new(
        live: Arc<Live>,
        metrics: Arc<crate::ops::metrics::Metrics>,
        demo: Option<String>,
    ) -> HealthChecker {
        HealthChecker {
            live,
            metrics,
            demo,
        }
    }
}

/// Longest wait at start for the demo upstream to listen.
const DEMO_START: Duration = Duration::from_secs(5);

/// Waits until `addr` accepts connections (at most [`DEMO_START`]). Services start side by
/// side: a check before the demo upstream's listener is up would find it refusing and take it
/// out of rotation for a whole interval.
async fn listening(addr: &str) {
    let deadline = Instant::now() + DEMO_START;
    while tokio::net::TcpStream::connect(addr).await.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if let Some(addr) = &self.demo {
            tokio::select! {
                _ = shutdown.changed() => return,
                () = listening(addr) => {}
            }
        }
        let connections = Arc::new(upstream::Connections::new(self.metrics.clone()));
        let mut due: HashMap<String, Instant> = HashMap::new();
        let mut tick = tokio::time::interval(TICK);
        let mut lookup_due = Instant::now() + upstream::DNS_REFRESH;
        // One round of lookups at a time: a resolver that hangs (each lookup can take tens of
        // seconds) must not pile rounds up on the blocking threads.
        let mut lookups: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let snapshot = self.live.snapshot();
            if now >= lookup_due && lookups.as_ref().is_none_or(|h| h.is_finished()) {
                lookup_due = now + upstream::DNS_REFRESH;
                let router = snapshot.router.clone();
                lookups = Some(tokio::task::spawn_blocking(move || look_up_again(&router)));
            }
            for pool in &snapshot.router.pools {
                let Some(every) = pool.cfg.health_interval else {
                    continue;
                };
                if due.get(&pool.name).is_some_and(|&at| at > now) {
                    continue;
                }
                due.insert(pool.name.clone(), now + every);
                for i in 0..pool.upstreams.len() {
                    let (pool, connections) = (pool.clone(), connections.clone());
                    // Owned by the health loop: a check ends within its timeout.
                    #[allow(clippy::disallowed_methods)]
                    tokio::spawn(async move { check(&connections, &pool, i).await });
                }
            }
        }
    }
}

/// Looks up again every upstream named by a host name (see `Upstream::resolve_again`).
fn look_up_again(router: &super::Router) {
    for pool in &router.pools {
        for up in pool.upstreams.iter().filter(|u| u.named()) {
            if let Some((old, new)) = up.resolve_again(upstream::lookup) {
                tracing::info!(pool = %pool.name, upstream = %up.cfg.url, %old, %new, "upstream moved to a new address");
            }
        }
    }
}

/// One check of upstream `i` of `pool`; its verdict goes to the upstream's health.
async fn check(connections: &upstream::Connections, pool: &Arc<Pool>, i: usize) {
    let Some(up) = pool.upstreams.get(i) else {
        return;
    };
    let deadline = pool
        .cfg
        .health_interval
        .unwrap_or(Duration::from_secs(10))
        .min(pool.cfg.connect_timeout + Duration::from_secs(5));
    let verdict = match tokio::time::timeout(deadline, models(connections, up)).await {
        Ok(Ok(200..=299)) => Ok(()),
        Ok(Ok(status)) => Err(format!("GET /v1/models answered {status}")),
        Ok(Err(e)) => Err(format!("GET /v1/models failed: {}", e.etype().as_str())),
        Err(_) => Err(format!(
            "no answer to GET /v1/models within {} ms",
            deadline.as_millis()
        )),
    };
    let changed = up.health.checked(verdict.is_ok());
    match verdict {
        Err(why) if changed => tracing::warn!(
            pool = %pool.name, upstream = %up.cfg.url,
            "upstream out of rotation: {why}"
        ),
        Ok(()) if changed => tracing::info!(
            pool = %pool.name, upstream = %up.cfg.url,
            "upstream back in rotation: its health check passed"
        ),
        _ => {}
    }
}

/// `GET /v1/models` with the upstream's credential; its status.
async fn models(connections: &upstream::Connections, up: &Upstream) -> pingora_error::Result<u16> {
    let peer = up.peer();
    let mut req = RequestHeader::build("GET", b"/v1/models", Some(4))?;
    upstream::rewrite_request(&mut req, up, 0, "health-check", None)?;
    req.remove_header(&http::header::CONTENT_LENGTH);
    let req = upstream::Request::of(&req)?;
    // A kept connection the upstream closed as the check went out says nothing of its health:
    // the check goes again on a new one.
    let client = connections
        .exchange(&peer, |client| ask(client, &req))
        .await?;
    let status = client.response_header().map_or(0, |r| r.status.as_u16());
    connections.release(client).await;
    Ok(status)
}

/// Sends the check on `client` and reads its reply whole (a small list), so that the
/// connection can be reused for the next check.
async fn ask(
    mut client: Box<crate::upstream::Conn>,
    req: &upstream::Request,
) -> pingora_error::Result<Box<crate::upstream::Conn>> {
    client.send(req, &[]).await?;
    client.read_final_header(None).await?;
    while client.read_response_body().await?.is_some() {}
    Ok(client)
}
