//! The live state both API listeners share: the config, and one snapshot of the key table and
//! the router behind one `ArcSwap`. A reload prepares a new snapshot, then swaps it in one
//! store; each request loads the snapshot once, at its start, so a reload never changes a
//! request midway.

use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use super::Router;
use crate::config::keys::KeyTable;
use crate::config::{Config, ConsoleConfig, Problems};
use crate::store::postgres::keys as keys_table;

/// What one request sees of the live state.
pub struct Snapshot {
    pub keys: Arc<KeyTable>,
    pub router: Arc<Router>,
}

pub struct Live {
    /// The config as loaded at start: what a reload does not change (see `reload`).
    pub config: Arc<Config>,
    state: ArcSwap<Snapshot>,
    /// `[console]` in force: a reload changes it (a password rotated takes effect at once, and
    /// ends the sessions made with the old one).
    console: ArcSwapOption<ConsoleConfig>,
}

impl Live {
    /// Loads the keys (file or Postgres table) and builds the router; every problem of both is reported.
    pub fn load(config: Config) -> Result<Live, Problems> {
        let mut problems = Problems::default();
        let keys = match (&config.postgres, config.keys_in_postgres) {
            (Some(url), true) => keys_table::load(url.expose()),
            _ => KeyTable::load(&config.keys_file),
        };
        let keys = keys.map_err(|p| problems.extend(p)).ok();
        let router = Router::build(&config).map_err(|p| problems.extend(p)).ok();
        match (keys, router) {
            (Some(keys), Some(router)) => Ok(Live {
                console: ArcSwapOption::from(config.console.clone().map(Arc::new)),
                config: Arc::new(config),
                state: ArcSwap::from_pointee(Snapshot {
                    keys: Arc::new(keys),
                    router: Arc::new(router),
                }),
            }),
            _ => Err(problems),
        }
    }

    /// The state in force now; hold it for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.state.load_full()
    }

    /// `[console]` as in force now (None: no console).
    pub fn console(&self) -> Option<Arc<ConsoleConfig>> {
        self.console.load_full()
    }

    pub fn set_console(&self, console: Option<ConsoleConfig>) {
        self.console.store(console.map(Arc::new));
    }

    /// Puts a new router (pools, models, prices, fallbacks) in force; the keys stay.
    pub fn set_router(&self, router: Router) {
        let router = Arc::new(router);
        self.state.rcu(|cur| Snapshot {
            keys: cur.keys.clone(),
            router: router.clone(),
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
        });
    }
}
