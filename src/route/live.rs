//! The live state both API listeners share: the config's fixed sections, and one snapshot of
//! what a reload changes (the key table, the router built from the pools and models, the
//! console) behind one `ArcSwap`. A reload prepares a new snapshot, then swaps it in one
//! store; each request loads the snapshot once, at its start, so a reload never changes a
//! request midway.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Router;
use crate::config::keys::KeyTable;
use crate::config::{Config, ConsoleConfig, Fixed, LiveConfig, Problems};
use crate::store::postgres::keys as keys_table;

/// What one request sees of the live state.
pub struct Snapshot {
    pub keys: Arc<KeyTable>,
    pub router: Arc<Router>,
    /// The reloadable sections the router was built from, and `[console]`.
    pub config: Arc<LiveConfig>,
}

impl Snapshot {
    /// `[console]` in force (None: no console).
    pub fn console(&self) -> Option<&ConsoleConfig> {
        self.config.console.as_ref()
    }
}

pub struct Live {
    /// The sections a reload does not change (see `reload`).
    pub fixed: Arc<Fixed>,
    state: ArcSwap<Snapshot>,
}

impl Live {
    /// Loads the keys (file or Postgres table) and builds the router; every problem of both is reported.
    pub fn load(config: Config) -> Result<Live, Problems> {
        let mut problems = Problems::default();
        let fixed = config.fixed;
        let keys = match (&fixed.storage.postgres, fixed.keys.in_postgres) {
            (Some(url), true) => keys_table::load(url.expose()),
            _ => KeyTable::load(&fixed.keys.file),
        };
        let keys = keys.map_err(|p| problems.extend(p)).ok();
        let router = Router::build(&config.live, &fixed.path)
            .map_err(|p| problems.extend(p))
            .ok();
        match (keys, router) {
            (Some(keys), Some(router)) => Ok(Live {
                fixed: Arc::new(fixed),
                state: ArcSwap::from_pointee(Snapshot {
                    keys: Arc::new(keys),
                    router: Arc::new(router),
                    config: Arc::new(config.live),
                }),
            }),
            _ => Err(problems),
        }
    }

    /// The state in force now; hold it for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.state.load_full()
    }

    /// Puts a new router and the sections it was built from (pools, models, prices,
    /// fallbacks, the console) in force; the keys stay.
    pub fn set_router(&self, router: Router, config: LiveConfig) {
        let (router, config) = (Arc::new(router), Arc::new(config));
        self.state.rcu(|cur| Snapshot {
            keys: cur.keys.clone(),
            router: router.clone(),
            config: config.clone(),
        });
    }

    /// Puts a new, already validated key table in force (the router stays). Concurrent
    /// swaps (the watcher and a console edit) each keep the other's router.
    pub fn set_keys(&self, mut keys: KeyTable) {
        keys.carry_over(&self.snapshot().keys);
        let keys = Arc::new(keys);
        self.state.rcu(|cur| Snapshot {
            keys: keys.clone(),
            router: cur.router.clone(),
            config: cur.config.clone(),
        });
    }
}
