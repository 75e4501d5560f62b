//! Route stage: model name → its pool and upstream credential, and which upstream of the pool
//! takes this request (`balance`). Built once per config and swapped whole.

pub mod balance;
pub mod body;
pub mod endpoint;
pub mod health;
pub mod live;
#[cfg(test)]
mod path_props;
#[cfg(test)]
mod props;
pub mod reload;
pub mod retry;
pub mod stored;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{LiveConfig, ModelConfig, PoolConfig, Problems};
use crate::upstream::Upstream;
use crate::upstream::health::{Health, now_ms};
use balance::Balancer;

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
        let now = now_ms();
        self.upstreams
            .iter()
            .enumerate()
            .any(|(i, u)| !tried.contains(&i) && u.health.healthy(now))
    }
}

pub struct Route {
    pub model: ModelConfig,
    pub pool: Arc<Pool>,
}

impl Route {
    /// The id a request for `asked` is served and recorded as: the id itself on a glob entry,
    /// else the entry's name (an alias is its model).
    pub fn id_for<'a>(&'a self, asked: &'a str) -> &'a str {
        if crate::config::is_glob(&self.model.name) {
            asked
        } else {
            &self.model.name
        }
    }

    /// The model to splice into the body for the upstream serving `id` (`id_for`), if it
    /// differs from `in_body`, the model the client's body names: `upstream_model`, its
    /// `{model}` replaced by `id` (a string made only for a template).
    pub fn upstream_rename(&self, id: &str, in_body: &str) -> Option<Cow<'_, str>> {
        let up = &self.model.upstream_model;
        let up = match up.contains("{model}") {
            true => Cow::Owned(up.replace("{model}", id)),
            false => Cow::Borrowed(up.as_str()),
        };
        (up != in_body).then_some(up)
    }
}

/// The route a request's model takes, and the id it is served as (`Route::id_for`) where
/// that is not the id asked (an alias, a default model).
pub struct Found {
    pub route: Arc<Route>,
    pub id: Option<String>,
}

pub struct Router {
    /// Entries by name and by alias.
    by_model: HashMap<String, Arc<Route>, foldhash::fast::RandomState>,
    /// Glob entries, in config order: the first that matches takes an id no name matched.
    globs: Vec<(globset::GlobMatcher, Arc<Route>)>,
    /// `[routing] default_model`.
    default_model: Option<String>,
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
        let now = now_ms();
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
    /// The router of `config`'s pools and models (`file`, the config file, for problems).
    pub fn build(config: &LiveConfig, file: &std::path::Path) -> Result<Router, Problems> {
        Self::build_after(config, file, None)
    }

    /// Like `build`, for a reload: an upstream that stays (same pool, same URL) keeps its
    /// health as the router in force sees it.
    pub fn build_after(
        config: &LiveConfig,
        file: &std::path::Path,
        previous: Option<&Router>,
    ) -> Result<Router, Problems> {
        let file = file.display().to_string();
        let mut problems = Problems::default();
        let mut pools = HashMap::new();
        for p in &config.pools {
            let mut upstreams = Vec::new();
            for u in &p.upstreams {
                let health = previous
                    .and_then(|r| r.health_of(&p.name, &u.url))
                    .unwrap_or_default();
                match Upstream::build(p, u, health, &file) {
                    Ok(up) => upstreams.push(up),
                    Err(problem) => problems.push(problem),
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
        let mut by_model = HashMap::default();
        let mut globs = Vec::new();
        let mut ordered = Vec::new();
        for m in &config.models {
            if let Some(pool) = pools.get(&m.pool) {
                let r = Arc::new(Route {
                    model: m.clone(),
                    pool: pool.clone(),
                });
                match globset::Glob::new(&m.name) {
                    Ok(g) if crate::config::is_glob(&m.name) => {
                        globs.push((g.compile_matcher(), r.clone()));
                    }
                    _ => {
                        by_model.insert(m.name.clone(), r.clone());
                    }
                }
                for a in &m.aliases {
                    by_model.insert(a.clone(), r.clone());
                }
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
            globs,
            default_model: config.default_model.clone(),
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

    /// The entry `model` names: by name or alias, else the first glob that matches it.
    pub fn get(&self, model: &str) -> Option<&Arc<Route>> {
        self.by_model.get(model).or_else(|| {
            self.globs
                .iter()
                .find(|(g, _)| g.is_match(model))
                .map(|(_, r)| r)
        })
    }

    /// The route for `asked`, else for the key's default model (`key_default`), else for
    /// `[routing] default_model`.
    pub fn resolve(&self, asked: &str, key_default: Option<&str>) -> Option<Found> {
        let (route, id) = match self.get(asked) {
            Some(route) => (route, route.id_for(asked)),
            None => {
                let default = key_default.or(self.default_model.as_deref())?;
                let route = self.get(default)?;
                (route, route.id_for(default))
            }
        };
        Some(Found {
            id: (id != asked).then(|| id.to_string()),
            route: route.clone(),
        })
    }

    /// The ids `/v1/models` lists: each entry's name (a glob's only by its aliases) and its
    /// aliases, in config order, with the route of each.
    pub fn listed(&self) -> impl Iterator<Item = (&str, &Arc<Route>)> {
        self.ordered.iter().flat_map(|r| {
            let name = (!crate::config::is_glob(&r.model.name)).then_some(r.model.name.as_str());
            name.into_iter()
                .chain(r.model.aliases.iter().map(String::as_str))
                .map(move |id| (id, r))
        })
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
    let path = std::path::Path::new("/tmp/c.toml");
    let config = crate::config::Config::parse(path, &text).expect("config");
    Router::build(&config.live, path).expect("router")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod dns_tests {
    use super::*;
    use std::net::SocketAddr;

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
