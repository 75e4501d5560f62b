//! Route stage: model name → its pool and upstream credential, and which upstream of the pool
//! takes this request (`balance`). Built once per config and swapped whole.

pub mod balance;
pub mod body;
pub mod endpoint;
pub mod health;
#[cfg(test)]
mod path_props;
#[cfg(test)]
mod props;
pub mod retry;
pub mod stored;

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use http::HeaderValue;
use pingora_core::upstreams::peer::HttpPeer;

use crate::config::{
    AuthHeader, Config, ModelConfig, PoolConfig, Problem, Problems, Secret, UpstreamConfig,
};
use balance::{Balancer, Health};

pub struct Upstream {
    pub cfg: UpstreamConfig,
    /// Where connections go (its address, TLS and SNI, the pool's timeouts): the address
    /// resolved at load, and again every `DNS_REFRESH` when the URL names a host (see
    /// `resolve_again`). One for every try, not one a try.
    peer: arc_swap::ArcSwap<HttpPeer>,
    /// `Host` header value: host, plus the port when it is not the scheme's default.
    pub host_header: HeaderValue,
    /// The credential (the upstream's own key, else the pool's), sent in place of the
    /// client's: `Bearer <key>` in `Authorization`, or the key in `x-api-key`.
    pub authorization: Option<(http::HeaderName, HeaderValue)>,
    pub health: Arc<Health>,
}

/// How often an upstream named by a host name is looked up again: a provider that moves to
/// new addresses (hosted APIs behind a CDN do) is followed within this, without a restart.
pub const DNS_REFRESH: std::time::Duration = std::time::Duration::from_secs(30);

impl Upstream {
    /// The address a connection to it goes to now (always an internet address: the peer is
    /// made from one, `upstream::peer`).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.peer.load()._address.as_inet().copied()
    }

    /// The peer a connection to it is made to now.
    pub fn peer(&self) -> Arc<HttpPeer> {
        self.peer.load_full()
    }

    /// Whether its URL names a host (not an address) that may move.
    pub fn named(&self) -> bool {
        self.cfg.host.parse::<std::net::IpAddr>().is_err()
    }

    /// Looks its host up again with `resolve` (blocking); the address in use stays while the
    /// host still has it (no hopping between a name's addresses), else the first one is taken.
    /// Returns the old and new address when it moved.
    pub fn resolve_again(
        &self,
        resolve: impl Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
    ) -> Option<(SocketAddr, SocketAddr)> {
        let found = resolve(&self.cfg.host, self.cfg.port).ok()?;
        let now = self.addr()?;
        if found.contains(&now) {
            return None;
        }
        let new = *found.first()?;
        let mut peer = HttpPeer::clone(&self.peer.load());
        peer._address = pingora_core::protocols::l4::socket::SocketAddr::Inet(new);
        self.peer.store(Arc::new(peer));
        Some((now, new))
    }
}

/// The addresses of `host` (the system's resolver, blocking).
pub fn lookup(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok((host, port).to_socket_addrs()?.collect())
}

pub struct Pool {
    pub name: String,
    pub upstreams: Vec<Upstream>,
    /// Timeouts, retries, health interval.
    pub cfg: PoolConfig,
    balancer: Balancer,
}

impl Pool {
    /// The upstream for a request's next try, skipping the ones it tried while others are
    /// healthy; None when none is.
    pub fn pick(&self, tried: &[usize]) -> Option<usize> {
        self.balancer
            .pick(|i| self.upstreams.get(i).map(|u| &*u.health), tried)
    }

    /// A failed connection, reset or timeout on `up`. A pool of one never ejects its only
    /// upstream on what requests see (as nginx does): that would turn one bad moment into a
    /// cool-down of refusals; its active check can still take it out.
    pub fn transport_failed(&self, up: &Upstream) {
        if self.upstreams.len() > 1 {
            up.health.transport_failed(self.cfg.cooldown);
        } else {
            up.health.count_failure();
        }
    }

    /// A 5xx reply from `up` (see `transport_failed` for a pool of one).
    pub fn server_error(&self, up: &Upstream) {
        if self.upstreams.len() > 1 {
            up.health.server_error(self.cfg.cooldown);
        } else {
            up.health.count_failure();
        }
    }

    /// Whether an upstream other than `tried` ones is healthy (does not take a turn).
    pub fn has_healthy(&self, tried: &[usize]) -> bool {
        let now = balance::now_ms();
        self.upstreams
            .iter()
            .enumerate()
            .any(|(i, u)| !tried.contains(&i) && u.health.healthy(now))
    }
}

/// The credential header for `key`, its value marked never to be logged.
fn credential(key: &Secret, header: AuthHeader) -> Option<(http::HeaderName, HeaderValue)> {
    let (name, value) = match header {
        AuthHeader::Authorization => (
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {}", key.expose())),
        ),
        AuthHeader::XApiKey => (
            http::HeaderName::from_static("x-api-key"),
            HeaderValue::from_str(key.expose()),
        ),
    };
    let mut value = value.ok()?;
    value.set_sensitive(true);
    Some((name, value))
}

pub struct Route {
    pub model: ModelConfig,
    pub pool: Arc<Pool>,
}

impl Route {
    /// The model name to splice into the body for the upstream, if it differs from `asked`,
    /// the name the client's body holds (this route's own name, or for a fallback the model
    /// the client asked for).
    pub fn upstream_rename(&self, asked: &str) -> Option<&str> {
        (self.model.upstream_model != asked).then_some(self.model.upstream_model.as_str())
    }
}

pub struct Router {
    by_model: HashMap<String, Arc<Route>>,
    /// Config order, for GET /v1/models.
    pub ordered: Vec<Arc<Route>>,
    /// Every pool, in config order (models may share one; unused pools are here too).
    pub pools: Vec<Arc<Pool>>,
    /// Unix seconds, shown as `created` in the model list.
    pub created: i64,
}

impl Router {
    /// Each upstream of the pools in force, healthy or not and its requests in flight, for
    /// `/metrics`.
    pub fn upstream_gauges(&self) -> Vec<crate::ops::metrics::UpstreamGauge<'_>> {
        let now = balance::now_ms();
        self.pools
            .iter()
            .flat_map(|pool| {
                pool.upstreams.iter().map(move |up| {
                    let (_, _, in_flight, _, _) = up.health.view(now);
                    crate::ops::metrics::UpstreamGauge {
                        pool: &pool.name,
                        url: &up.cfg.url,
                        healthy: up.health.healthy(now),
                        in_flight,
                    }
                })
            })
            .collect()
    }

    /// Resolves every upstream address; all problems are reported at once.
    pub fn build(config: &Config) -> Result<Router, Problems> {
        Self::build_after(config, None)
    }

    /// Like `build`, for a reload: an upstream that stays (same pool, same URL) keeps its
    /// health as the router in force sees it.
    pub fn build_after(config: &Config, previous: Option<&Router>) -> Result<Router, Problems> {
        let file = config.path.display().to_string();
        let mut problems = Problems::default();
        let mut pools = HashMap::new();
        for p in &config.pools {
            let mut upstreams = Vec::new();
            for u in &p.upstreams {
                match (u.host.as_str(), u.port)
                    .to_socket_addrs()
                    .map(|mut a| a.next())
                {
                    Ok(Some(addr)) => {
                        let default_port = if u.tls { 443 } else { 80 };
                        let host = if u.port == default_port {
                            u.host.clone()
                        } else if u.host.contains(':') {
                            format!("[{}]:{}", u.host, u.port)
                        } else {
                            format!("{}:{}", u.host, u.port)
                        };
                        let key = u.api_key.as_ref().or(p.api_key.as_ref());
                        let authorization = key.and_then(|k| credential(k, p.auth_header));
                        if key.is_some() && authorization.is_none() {
                            problems.push(Problem::new(
                                &file,
                                u.line,
                                &format!("pools.{}.api_key", p.name),
                                "not a valid header value",
                            ));
                        }
                        match HeaderValue::from_str(&host) {
                            Ok(host_header) => upstreams.push(Upstream {
                                cfg: u.clone(),
                                peer: arc_swap::ArcSwap::from_pointee(crate::upstream::peer(
                                    p, u, addr,
                                )),
                                host_header,
                                authorization,
                                health: previous
                                    .and_then(|r| r.health_of(&p.name, &u.url))
                                    .unwrap_or_default(),
                            }),
                            Err(_) => problems.push(Problem::new(
                                &file,
                                u.line,
                                &format!("pools.{}.upstreams", p.name),
                                format!("bad host in '{}'", u.url),
                            )),
                        }
                    }
                    _ => problems.push(Problem::new(
                        &file,
                        u.line,
                        &format!("pools.{}.upstreams", p.name),
                        format!("cannot resolve '{}'", u.url),
                    )),
                }
            }
            let weights: Vec<u32> = upstreams.iter().map(|u| u.cfg.weight).collect();
            pools.insert(
                p.name.clone(),
                Arc::new(Pool {
                    name: p.name.clone(),
                    upstreams,
                    balancer: Balancer::new(p.strategy, &weights),
                    cfg: p.clone(),
                }),
            );
        }
        let mut by_model = HashMap::new();
        let mut ordered = Vec::new();
        for m in &config.models {
            if let Some(pool) = pools.get(&m.pool) {
                let r = Arc::new(Route {
                    model: m.clone(),
                    pool: pool.clone(),
                });
                by_model.insert(m.name.clone(), r.clone());
                ordered.push(r);
            }
        }
        let created = time::OffsetDateTime::now_utc().unix_timestamp();
        let pools = config
            .pools
            .iter()
            .filter_map(|p| pools.get(&p.name).cloned())
            .collect();
        problems.into_result(Router {
            by_model,
            ordered,
            pools,
            created,
        })
    }

    /// The health of `url` in pool `pool`, shared with the upstream that has it now.
    fn health_of(&self, pool: &str, url: &str) -> Option<Arc<Health>> {
        self.pools
            .iter()
            .find(|p| p.name == pool)?
            .upstreams
            .iter()
            .find(|u| u.cfg.url == url)
            .map(|u| u.health.clone())
    }

    pub fn get(&self, model: &str) -> Option<&Arc<Route>> {
        self.by_model.get(model)
    }
}

/// The router of a config of these pools and models (its listeners and keys file made up),
/// for tests.
#[cfg(test)]
pub(crate) fn test_router(pools_and_models: &str) -> Router {
    let text = format!(
        "[listeners]\nmain = \"127.0.0.1:1\"\ndirect = \"127.0.0.1:2\"\n\
         [keys]\nfile = \"keys.toml\"\n{pools_and_models}"
    );
    let config = Config::parse(std::path::Path::new("/tmp/c.toml"), &text).expect("config");
    Router::build(&config).expect("router")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod dns_tests {
    use super::*;

    /// An upstream named by a host follows the host to a new address (it went on to the old
    /// one until a restart); while the host still has the address in use, it stays there.
    #[test]
    fn an_upstream_named_by_a_host_follows_it_to_a_new_address() {
        let router = test_router(
            "[[pools]]\nname = \"p\"\n\
             upstreams = [\"http://localhost:9\", \"http://127.0.0.1:9\"]\n\
             [[models]]\nname = \"m\"\npool = \"p\"\n",
        );
        let pool = router.pools.first().unwrap();
        let (named, literal) = (&pool.upstreams[0], &pool.upstreams[1]);
        assert!(named.named() && !literal.named());
        let at = |ip: &str| -> SocketAddr { format!("{ip}:9").parse().unwrap() };
        let first = named.addr().expect("inet");
        // Still there among others: no move.
        assert_eq!(
            named.resolve_again(|_, _| Ok(vec![at("10.0.0.7"), first])),
            None
        );
        // Gone: the first new one.
        assert_eq!(
            named.resolve_again(|_, _| Ok(vec![at("10.0.0.7"), at("10.0.0.8")])),
            Some((first, at("10.0.0.7")))
        );
        assert_eq!(named.addr().expect("inet"), at("10.0.0.7"));
        assert_eq!(upstream_peer_addr(named), at("10.0.0.7"));
        // The moved peer keeps everything else: the pool's timeouts, TLS and SNI.
        let moved = named.peer();
        let made = crate::upstream::peer(&pool.cfg, &named.cfg, at("10.0.0.7"));
        assert_eq!(
            moved.options.connection_timeout,
            made.options.connection_timeout
        );
        assert_eq!(moved.options.read_timeout, made.options.read_timeout);
        assert_eq!(moved.options.write_timeout, made.options.write_timeout);
        assert_eq!(moved.options.idle_timeout, made.options.idle_timeout);
        assert_eq!(
            moved.options.connection_timeout,
            Some(pool.cfg.connect_timeout)
        );
        assert_eq!((moved.is_tls(), &moved.sni), (made.is_tls(), &made.sni));
        // A failed or empty lookup keeps the address in use.
        assert_eq!(
            named.resolve_again(|_, _| Err(std::io::ErrorKind::NotFound.into())),
            None
        );
        assert_eq!(named.resolve_again(|_, _| Ok(vec![])), None);
        assert_eq!(named.addr().expect("inet"), at("10.0.0.7"));
    }

    fn upstream_peer_addr(up: &Upstream) -> SocketAddr {
        use pingora_core::upstreams::peer::Peer;
        match up.peer().address() {
            pingora_core::protocols::l4::socket::SocketAddr::Inet(a) => *a,
            other => panic!("{other:?}"),
        }
    }
}
