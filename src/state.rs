//! What the `main` and `direct` listeners (and the admin listener) share: the live config and
//! keys, the usage store, the spend ledger, the rate limiter and the web stage's own state.
//! Built once in `serve`; every request reads it through one `Arc`.

use std::sync::Arc;

use crate::config::live::Live;
use crate::limit::budget::Spend;
use crate::limit::rate::Limiter;
use crate::store::Store;

pub struct Shared {
    pub live: Arc<Live>,
    pub store: Arc<Store>,
    pub spend: std::sync::Arc<Spend>,
    pub limiter: Limiter,
    /// `[limits] redis`: the limits and spend every gateway of a fleet shares.
    pub shared_limits: Option<Arc<crate::limit::shared::SharedLimits>>,
    pub web: crate::web::WebState,
    /// Requests in flight, and the signal that ends them at shutdown.
    pub lifecycle: Arc<crate::ops::lifecycle::Lifecycle>,
    /// One line per request on stderr; None when `[log] access = "off"`.
    pub access_log: Option<crate::ops::access_log::AccessLog>,
    /// Which upstream made each stored response (Responses API).
    pub stored: crate::route::stored::StoredResponses,
}

/// Which API listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Main,
    Direct,
}

impl Listener {
    pub fn name(self) -> &'static str {
        match self {
            Listener::Main => "main",
            Listener::Direct => "direct",
        }
    }
}
