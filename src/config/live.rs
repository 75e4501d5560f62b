//! The live state both API listeners share: the config, the key table and the router, each
//! an immutable snapshot behind `ArcSwap`. A reload prepares a new snapshot, then swaps it in
//! one store; each request loads one snapshot at its start.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::keys::KeyTable;
use super::{Config, Problems};
use crate::route::Router;

pub struct Live {
    pub config: Arc<Config>,
    pub keys: ArcSwap<KeyTable>,
    pub router: ArcSwap<Router>,
}

impl Live {
    /// Loads the keys file and builds the router; every problem of both is reported.
    pub fn load(config: Config) -> Result<Live, Problems> {
        let mut problems = Problems::default();
        let keys = KeyTable::load(&config.keys_file)
            .map_err(|p| problems.extend(p))
            .ok();
        let router = Router::build(&config).map_err(|p| problems.extend(p)).ok();
        match (keys, router) {
            (Some(keys), Some(router)) => Ok(Live {
                config: Arc::new(config),
                keys: ArcSwap::from_pointee(keys),
                router: ArcSwap::from_pointee(router),
            }),
            _ => Err(problems),
        }
    }
}
