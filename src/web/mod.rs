//! Web stage: every path the gateway answers itself instead of proxying: the usage-record page
//! on `direct /` and its assets, the usage API (`/api/usage…`) and the OpenAI-compatible billing
//! endpoints (`/v1/dashboard/billing/…`). `request_filter` hands such a path here in one call;
//! this stage owns its routes and state, answers through the web responder, and tells the
//! proxy only which key (if any) passed auth, so the request leaves its usage record.
//! Usage queries do not count against a key's rpm/tpm.

mod billing;
mod console;
pub mod cors;
mod page;
pub mod params;
pub mod summary;
pub mod usage_api;

use std::net::IpAddr;
use std::sync::Arc;

use pingora_proxy::Session;

use crate::auth;
use crate::config::Listener;
use crate::config::keys::Key;
use crate::error::{ErrorShape, GatewayError};
use crate::http1::respond;
use crate::limit::budget::Spend;
use crate::route::endpoint::Group;
use crate::route::live::Live;
use crate::store::Store;
use crate::store::StoreError;

use crate::auth::Throttle;

/// What the web stage's routes share, on both listeners: the live config and keys, the store,
/// the spend ledger, and the stage's own throttles.
pub struct Web {
    pub live: Arc<Live>,
    pub metrics: Arc<crate::ops::metrics::Metrics>,
    pub store: Arc<Store>,
    pub spend: Arc<Spend>,
    /// Wrong keys per client address.
    pub throttle: Throttle,
    /// Failed console sign-ins per client address.
    pub logins: Throttle,
    /// Failed console sign-ins across all addresses.
    pub sign_ins: console::guard::Guard,
    /// Each key's usage and billing calls (apart from its rpm).
    pub usage_calls: UsageCalls,
}

/// The most usage and billing calls (`/api/usage…`, `/v1/dashboard/billing/…`) one key may
/// have under way at once, and start in one second: a summary or an export reads the store
/// and does real work, so one key holder cannot take the gateway's memory or threads with
/// them, whatever its rpm says. Approximate counts (pingora-limits' estimators), as a
/// throttle's may be.
pub const USAGE_CALLS_AT_ONCE: isize = 8;
pub const USAGE_CALLS_PER_SECOND: isize = 100;

/// The counts behind `USAGE_CALLS_AT_ONCE` and `USAGE_CALLS_PER_SECOND`, per key.
pub struct UsageCalls {
    at_once: pingora_limits::inflight::Inflight,
    started: pingora_limits::rate::Rate,
}

impl Default for UsageCalls {
    fn default() -> UsageCalls {
        UsageCalls {
            at_once: pingora_limits::inflight::Inflight::new(),
            started: pingora_limits::rate::Rate::new(std::time::Duration::from_secs(1)),
        }
    }
}

impl std::fmt::Debug for UsageCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageCalls").finish_non_exhaustive()
    }
}

impl UsageCalls {
    /// Counts a call of `key_id`: its place (held until the guard drops), or the refusal when
    /// the key has too many under way or started too many this second.
    pub fn enter(&self, key_id: &str) -> Result<pingora_limits::inflight::Guard, GatewayError> {
        let refused = |what: &str| GatewayError::RateLimited {
            message: format!(
                "Too many usage calls for this key {what}; retry in a second (this bound is \
                 apart from the key's rpm)."
            ),
            retry_after: 1,
            reason: "usage_calls",
        };
        if self.started.observe(&key_id, 1) > USAGE_CALLS_PER_SECOND {
            return Err(refused("this second"));
        }
        let (guard, n) = self.at_once.incr(key_id, 1);
        if n > USAGE_CALLS_AT_ONCE {
            return Err(refused(&format!("at once (at most {USAGE_CALLS_AT_ONCE})")));
        }
        Ok(guard)
    }
}

/// One request as the web stage sees it, and what it tells the proxy back.
pub struct Exchange {
    pub request_id: String,
    pub listener: Listener,
    pub client: Option<IpAddr>,
    /// Set once a key passed auth: the request then leaves a usage record.
    pub key: Option<Arc<Key>>,
    /// What went to the client, as the writer recorded it (the request's final status is
    /// settled from it at its end).
    pub sent: respond::Sent,
    /// The code of a 4xx refusal sent, for the metrics.
    pub refusal: Option<&'static str>,
    /// `Access-Control-Allow-Origin` for an allowed browser origin (the key-authenticated
    /// APIs only, see `cors_path`).
    pub cors: Option<http::HeaderValue>,
    /// What bounds the writes of the reply (see `respond::Bound`).
    pub send_timeout: std::time::Duration,
    pub life: Option<Arc<crate::ops::lifecycle::Lifecycle>>,
    /// When the request came (its record's time).
    pub time_ms: i64,
    /// The journal entry of a request whose key passed auth (a crash leaves its record).
    pub journal: Option<crate::store::journal::Entry>,
}

impl Exchange {
    pub fn bound(&self) -> respond::Bound<'_> {
        respond::Bound {
            limit: self.send_timeout,
            life: self.life.as_deref(),
        }
    }

    /// The reply as the writer writes it.
    pub fn writing(&mut self) -> respond::Writing<'_> {
        respond::Writing {
            request_id: &self.request_id,
            bound: respond::Bound {
                limit: self.send_timeout,
                life: self.life.as_deref(),
            },
            sent: &mut self.sent,
        }
    }
}

/// The paths this stage answers: all but the proxied `/v1` API.
pub fn owns(path: &str) -> bool {
    !path.starts_with("/v1/") || path.starts_with("/v1/dashboard/")
}

/// The paths of this stage a browser page of another origin may call under `[cors]`: the
/// usage and billing APIs, which take a bearer key. Never the pages or the console, whose
/// session cookie must not be usable from another origin.
pub fn cors_path(path: &str) -> bool {
    path == "/api/usage"
        || path.starts_with("/api/usage.")
        || path.starts_with("/api/usage/")
        || path.starts_with("/v1/dashboard/")
}

/// The console's sign-in guard, knowing the addresses its users signed in from (read from the
/// audit log: they go past the gate after a restart too).
pub fn sign_in_guard(store: &Store) -> console::guard::Guard {
    console::guard::Guard::knowing(&store.console.audit_list(10_000).unwrap_or_default())
}

/// The endpoint group a path of this stage is counted under (metrics, access log): `usage`
/// for the usage and billing APIs, `console` for the console's paths, `page` for the pages
/// and their assets, `none` for anything else (a scanner's guesses).
pub fn group_of(path: &str) -> &'static str {
    if cors_path(path) {
        "usage"
    } else if path == "/console" || path.starts_with("/console/") {
        "console"
    } else if path == "/" || page::asset(path).is_some() {
        "page"
    } else {
        "none"
    }
}

enum Route {
    Page,
    Asset(&'static page::Asset),
    Usage { csv: bool },
    Summary,
    Subscription,
    BillingUsage,
    NotFound,
}

fn route(method: &http::Method, path: &str, listener: Listener) -> Route {
    if method != http::Method::GET && method != http::Method::HEAD {
        return Route::NotFound;
    }
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    match path {
        "/" if listener == Listener::Direct => Route::Page,
        "/api/usage" => Route::Usage { csv: false },
        "/api/usage.csv" => Route::Usage { csv: true },
        "/api/usage/summary" => Route::Summary,
        "/v1/dashboard/billing/subscription" => Route::Subscription,
        "/v1/dashboard/billing/usage" => Route::BillingUsage,
        _ => match page::asset(path) {
            Some(a) => Route::Asset(a),
            None => Route::NotFound,
        },
    }
}

/// Answers one request. Errors here are only write errors to the client.
pub async fn serve(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
) -> pingora_error::Result<()> {
    let req = session.req_header();
    let path = req.uri.path().to_string();
    if auth::key_in_query(req.uri.query(), &web.live.snapshot().keys) {
        let message = "Keys are read only from 'Authorization: Bearer', never from the URL.";
        let e = GatewayError::InvalidParameter {
            param: "api_key",
            message: message.into(),
        };
        return fail(session, ex, &e).await;
    }
    if ex.listener == Listener::Main {
        if let Some(r) = console::route(&req.method, &path) {
            return console::serve(web, session, ex, r).await;
        }
    }
    match route(&req.method, &path, ex.listener) {
        Route::Page => page::send_page(session, ex).await,
        Route::Asset(a) => page::send_asset(session, ex, a).await,
        Route::NotFound => fail(session, ex, &GatewayError::NotFound(path)).await,
        keyed => {
            // A full usage store (`on_store_full = "refuse"`) takes no call that would leave a
            // record it cannot keep, as for `/v1`: refused before auth, it leaves none.
            if web.store.refuses() {
                return fail(session, ex, &GatewayError::StoreUnavailable).await;
            }
            let Some(key) = authorize(web, session, ex).await? else {
                return Ok(());
            };
            ex.journal = web.store.journal_open(crate::store::journal::OpenedRef {
                time_ms: ex.time_ms,
                request_id: &ex.request_id,
                key_id: &key.id,
                listener: ex.listener.name(),
                endpoint: group_of(&path),
                sent: None,
            });
            if let Some(entry) = &ex.journal {
                entry.durable().await;
            }
            let _call = match web.usage_calls.enter(&key.id) {
                Ok(guard) => guard,
                Err(e) => return fail(session, ex, &e).await,
            };
            match keyed {
                Route::Usage { csv } => usage_api::answer(web, session, ex, &key, csv).await,
                Route::Summary => summary::answer(web, session, ex, &key).await,
                Route::Subscription => billing::subscription(web, session, ex, &key).await,
                Route::BillingUsage => billing::usage(web, session, ex, &key).await,
                Route::Page | Route::Asset(_) | Route::NotFound => Ok(()),
            }
        }
    }
}

/// The bearer key with the `usage` permission, or None once a refusal is sent. Wrong keys count
/// against the client address; an address over the limit is refused before its key is looked at.
async fn authorize(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
) -> pingora_error::Result<Option<Arc<Key>>> {
    let token = match auth::presented(&session.req_header().headers, false) {
        Ok(token) => token,
        Err(e) => {
            fail(session, ex, &e).await?;
            return Ok(None);
        }
    };
    let keys = &web.live.snapshot().keys;
    let throttle = &web.throttle;
    match auth::authenticate_guarded(keys, throttle, ex.client, token, now_unix(), &web.metrics) {
        Ok(key) => {
            ex.key = Some(key.clone());
            if !key.may_use(Group::Usage) {
                let e = GatewayError::PermissionDenied {
                    param: "endpoint",
                    message: "This key may not use the 'usage' endpoints.".into(),
                };
                fail(session, ex, &e).await?;
                return Ok(None);
            }
            Ok(Some(key))
        }
        Err(e) => {
            fail(session, ex, &e).await?;
            Ok(None)
        }
    }
}

/// Sends an error in the contract's shape and notes its status.
async fn fail(
    session: &mut Session,
    ex: &mut Exchange,
    e: &GatewayError,
) -> pingora_error::Result<()> {
    if (400..500).contains(&e.status()) {
        ex.refusal = Some(e.reason());
    }
    let cors = ex.cors.clone();
    respond::error(session, ex.writing(), e, ErrorShape::OpenAi, |h| {
        crate::web::cors::decorate(h, cors.as_ref())
    })
    .await
}

/// Sends a JSON body with `Cache-Control: no-store` (usage data is per key).
async fn json(
    session: &mut Session,
    ex: &mut Exchange,
    body: &serde_json::Value,
) -> pingora_error::Result<()> {
    let body = bytes::Bytes::from(body.to_string());
    let cors = ex.cors.clone();
    let cors = cors.as_ref();
    respond::send(session, ex.writing(), 200, "application/json", body, |h| {
        no_store(h)?;
        crate::web::cors::decorate(h, cors)
    })
    .await
}

fn no_store(h: &mut pingora_http::ResponseHeader) -> pingora_error::Result<()> {
    h.insert_header("cache-control", "no-store")
}

/// A store failure: logged in full, answered with a generic 500.
fn store_failed(request_id: &str, e: &StoreError) -> GatewayError {
    tracing::error!(request_id, "usage store read failed: {e}");
    GatewayError::Internal("The usage store could not answer; try again.".into())
}

/// Runs a blocking store read off the proxy's runtime.
/// A database server that stops answering holds a read for good; past it the request is
/// answered (500) rather than held (the read itself ends when the server answers).
pub const STORE_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::time::timeout(STORE_READ_LIMIT, tokio::task::spawn_blocking(f)).await {
        Ok(done) => {
            done.unwrap_or_else(|e| Err(StoreError(format!("usage store: reader task: {e}"))))
        }
        Err(_) => Err(StoreError(format!(
            "usage store: no answer within {} s",
            STORE_READ_LIMIT.as_secs()
        ))),
    }
}

fn now_unix() -> i64 {
    jiff::Timestamp::now().as_second()
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_usage_calls_are_bounded_at_once_and_per_second() {
        let calls = UsageCalls::default();
        let held: Vec<_> = (0..USAGE_CALLS_AT_ONCE)
            .map(|_| calls.enter("a").expect("a place"))
            .collect();
        let refused = calls.enter("a").expect_err("one too many at once");
        assert_eq!(refused.status(), 429);
        assert_eq!(refused.reason(), "usage_calls");
        // Another key is not held back.
        drop(calls.enter("b").expect("another key's place"));
        drop(held);
        drop(calls.enter("a").expect("a place again"));
        // Past the second's starts, refused even with none under way.
        let calls = UsageCalls::default();
        for _ in 0..USAGE_CALLS_PER_SECOND {
            drop(calls.enter("c").expect("within the second"));
        }
        assert_eq!(calls.enter("c").expect_err("too many").status(), 429);
    }
}
