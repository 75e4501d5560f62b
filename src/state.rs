//! What the listeners share, split by who needs it: the web stage's (`web::Web`: the live
//! config and keys, the store, the spend ledger, its throttles) and the proxy's
//! (`proxy::Shared`: those, plus the rate limiter, the fleet's shared limits, the lifecycle,
//! the access log). Built once at start; every request reads it through one `Arc`.

use std::sync::Arc;

use crate::config::Fixed;
use crate::limit::budget::Spend;
use crate::limit::shared::SharedLimits;
use crate::ops::metrics::Metrics;
use crate::proxy;
use crate::route::live::Live;
use crate::store::Store;
use crate::web;

/// The state of a gateway serving `config`, from what the start made of it.
pub fn build(
    c: &Fixed,
    live: Arc<Live>,
    store: Arc<Store>,
    spend: Arc<Spend>,
    shared_limits: Option<Arc<SharedLimits>>,
    metrics: Arc<Metrics>,
) -> Arc<proxy::Shared> {
    let web = Arc::new(web::Web {
        live: live.clone(),
        metrics: metrics.clone(),
        store: store.clone(),
        spend: spend.clone(),
        throttle: crate::auth::Throttle::per_minute(c.limits.auth_failures_per_minute),
        logins: Default::default(),
        // The addresses the console's users signed in from, remembered across restarts.
        sign_ins: web::sign_in_guard(&store),
        usage_calls: Default::default(),
    });
    Arc::new(proxy::Shared {
        live,
        metrics,
        store,
        spend,
        limiter: Default::default(),
        shared_limits,
        web,
        lifecycle: Default::default(),
        access_log: crate::ops::access_log::AccessLog::start(
            c.log.access_rate,
            c.log.access_format,
            c.log.access_file.as_deref(),
        ),
        stored: Default::default(),
    })
}
