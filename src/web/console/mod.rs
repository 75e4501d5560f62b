//! Web stage, the console on `main` (every path here is 404 on `direct`): the console page
//! (`/`, `/console`), sign-in and sign-out, and the JSON API behind the page: keys, usage across
//! every key (records, CSV, summary with per-key and per-model tables), models and pools as
//! configured, and the audit log. Every call but sign-in needs a session; every state-changing
//! one also a same-origin `Origin` or the page's CSRF token.

pub(super) mod guard;
mod keys;
mod login;

use pingora_proxy::Session;
use serde_json::{Value, json};

use super::summary::{self, local_time};
use super::{Exchange, fail, params, store_failed, usage_api};
use crate::error::GatewayError;
use crate::web::Web;

/// Console request bodies are small JSON objects.
const MAX_BODY: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Page,
    Login,
    Logout,
    SessionInfo,
    Keys,
    CreateKey,
    UpdateKey(String),
    DeleteKey(String),
    RotateKey(String),
    Usage { csv: bool },
    Summary,
    Models,
    Audit,
}

/// The console route of a request on `main`; None when the path is not the console's.
pub fn route(method: &http::Method, path: &str) -> Option<Route> {
    use http::Method as M;
    let get = method == M::GET || method == M::HEAD;
    let r = match (method, path) {
        (_, "/" | "/console" | "/console/") if get => Route::Page,
        (&M::POST, "/console/login") => Route::Login,
        (&M::POST, "/console/logout") => Route::Logout,
        (_, "/console/api/session") if get => Route::SessionInfo,
        (_, "/console/api/keys") if get => Route::Keys,
        (&M::POST, "/console/api/keys") => Route::CreateKey,
        (_, "/console/api/usage") if get => Route::Usage { csv: false },
        (_, "/console/api/usage.csv") if get => Route::Usage { csv: true },
        (_, "/console/api/usage/summary") if get => Route::Summary,
        (_, "/console/api/models") if get => Route::Models,
        (_, "/console/api/audit") if get => Route::Audit,
        _ => {
            let rest = path.strip_prefix("/console/api/keys/")?;
            let (id, action) = match rest.split_once('/') {
                Some((id, a)) => (id, Some(a)),
                None => (rest, None),
            };
            let id = params::decode(id);
            match (method, action) {
                (&M::PATCH, None) => Route::UpdateKey(id),
                (&M::DELETE, None) => Route::DeleteKey(id),
                (&M::POST, Some("rotate")) => Route::RotateKey(id),
                _ => return None,
            }
        }
    };
    Some(r)
}

fn changes_state(r: &Route) -> bool {
    matches!(
        r,
        Route::Logout
            | Route::CreateKey
            | Route::UpdateKey(_)
            | Route::DeleteKey(_)
            | Route::RotateKey(_)
    )
}

/// Reads a small request body within `client_body_timeout_ms`; None once a refusal is sent
/// (413 for a body over `MAX_BODY`, 408 for one that stalls: a client trickling a sign-in
/// holds no connection for long).
async fn body(
    session: &mut Session,
    ex: &mut Exchange,
    limit: std::time::Duration,
) -> pingora_error::Result<Option<Vec<u8>>> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = Vec::new();
    loop {
        let Ok(next) = tokio::time::timeout_at(deadline, session.read_request_body()).await else {
            // The rest of the body would be read as the next request.
            session.as_downstream_mut().set_keepalive(None);
            let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
            fail(session, ex, &GatewayError::RequestTimeout(ms)).await?;
            return Ok(None);
        };
        let next = match next {
            Ok(next) => next,
            Err(e) => {
                let e = crate::http1::respond::unreadable(session, e)?;
                fail(session, ex, &e).await?;
                return Ok(None);
            }
        };
        match next {
            Some(chunk) => {
                buf.extend_from_slice(&chunk);
                if buf.len() > MAX_BODY {
                    fail(session, ex, &GatewayError::RequestTooLarge(MAX_BODY)).await?;
                    return Ok(None);
                }
            }
            None => return Ok(Some(buf)),
        }
    }
}

pub async fn serve(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    route: Route,
) -> pingora_error::Result<()> {
    let snapshot = web.live.snapshot();
    let Some(console) = snapshot.console() else {
        let e = GatewayError::NotFound("the console (no [console] section in the config)".into());
        return fail(session, ex, &e).await;
    };
    match route {
        Route::Page => return super::page::send_console(session, ex).await,
        Route::Login => {
            let Some(b) = body(session, ex, web.live.fixed.server.client_body_timeout).await?
            else {
                return Ok(());
            };
            return login::login(web, session, ex, console, &b).await;
        }
        _ => {}
    }
    let who = match login::current(web, session, console).await {
        Ok(Some(w)) => w,
        Ok(None) => {
            let e = GatewayError::NotSignedIn {
                change: changes_state(&route),
            };
            return fail(session, ex, &e).await;
        }
        Err(e) => return fail(session, ex, &e).await,
    };
    if changes_state(&route) {
        if let Err(e) = login::check_csrf(session, console, &who) {
            return fail(session, ex, &e).await;
        }
    }
    match route {
        Route::Page | Route::Login => Ok(()),
        Route::Logout => login::logout(web, session, ex, &who).await,
        Route::SessionInfo => {
            let v = json!({
                "user": who.user,
                "csrf": who.csrf,
                "expires_at": local_time(who.expires_ms, &jiff::tz::TimeZone::UTC),
                "endpoint_groups": crate::route::endpoint::Group::ALL.map(|g| g.name()),
            });
            super::json(session, ex, &v).await
        }
        Route::Keys => keys::list(web, session, ex).await,
        Route::CreateKey => {
            match body(session, ex, web.live.fixed.server.client_body_timeout).await? {
                Some(b) => keys::create(web, session, ex, &who, &b).await,
                None => Ok(()),
            }
        }
        Route::UpdateKey(id) => {
            match body(session, ex, web.live.fixed.server.client_body_timeout).await? {
                Some(b) => keys::update(web, session, ex, &who, &id, &b).await,
                None => Ok(()),
            }
        }
        Route::DeleteKey(id) => keys::delete(web, session, ex, &who, &id).await,
        Route::RotateKey(id) => keys::rotate(web, session, ex, &who, &id).await,
        Route::Usage { csv } => usage(web, session, ex, csv).await,
        Route::Summary => usage_summary(web, session, ex).await,
        Route::Models => models(web, session, ex).await,
        Route::Audit => audit(web, session, ex).await,
    }
}

/// Every key's records (`key_id=` narrows to one), JSON pages or CSV.
async fn usage(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    csv: bool,
) -> pingora_error::Result<()> {
    let q = session.req_header().uri.query();
    let query = match usage_api::parse_query(q, None, super::now_ms(), csv) {
        Ok(q) => q,
        Err(e) => return fail(session, ex, &e).await,
    };
    if csv {
        usage_api::send_csv(session, ex, web, query).await
    } else {
        usage_api::send_page(session, ex, &web.store, query).await
    }
}

/// The summary across keys, with per-key, per-model and per-day tables.
async fn usage_summary(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
) -> pingora_error::Result<()> {
    let range = match summary::parse_range(session.req_header().uri.query(), super::now_ms(), true)
    {
        Ok(r) => r,
        Err(e) => return fail(session, ex, &e).await,
    };
    if let Err(e) = summary::bucket_starts(&range) {
        return fail(session, ex, &e).await;
    }
    let key_id = range.key_id.clone();
    match summary::summarize(web, key_id.as_deref(), &range).await {
        Ok(Ok(v)) => super::json(session, ex, &v).await,
        Ok(Err(e)) => fail(session, ex, &e).await,
        Err(e) => fail(session, ex, &store_failed(&ex.request_id, &e)).await,
    }
}

/// Pools and models as configured (no credential).
async fn models(web: &Web, session: &mut Session, ex: &mut Exchange) -> pingora_error::Result<()> {
    // The router in force: a reload's models, prices and pools show at once.
    let snapshot = web.live.snapshot();
    let router = &snapshot.router;
    let pools: Vec<Value> = router
        .pools
        .iter()
        .map(|p| &p.cfg)
        .map(|p| {
            json!({
                "name": p.name,
                "upstreams": p.upstreams.iter().map(|u| u.url.clone()).collect::<Vec<_>>(),
                "has_api_key": p.api_key.is_some(),
                "connect_timeout_ms": p.connect_timeout.as_millis() as u64,
                "read_timeout_ms": p.read_timeout.as_millis() as u64,
            })
        })
        .collect();
    let models: Vec<Value> = router
        .ordered
        .iter()
        .map(|r| &r.model)
        .map(|m| {
            json!({
                "name": m.name,
                "pool": m.pool,
                "upstream_model": m.upstream_model,
                "price": {"prompt": m.price.prompt, "completion": m.price.completion, "request": m.price.request,
                          "cached_prompt": m.price.cached_prompt, "cache_write": m.price.cache_write,
                          "reasoning": m.price.reasoning},
            })
        })
        .collect();
    super::json(session, ex, &json!({"pools": pools, "models": models})).await
}

async fn audit(web: &Web, session: &mut Session, ex: &mut Exchange) -> pingora_error::Result<()> {
    let limit = match params::parse(session.req_header().uri.query(), &["limit"]) {
        Ok(p) => p
            .first()
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(200)
            .clamp(1, 10_000),
        Err(e) => return fail(session, ex, &e).await,
    };
    let store = web.store.clone();
    // A minute of failed sign-ins that no later one summed up is summed up now.
    let unlisted = web
        .sign_ins
        .unlisted(std::time::Instant::now())
        .map(|n| login::unlisted_summary(n, super::now_ms()));
    let entries = match super::blocking(move || {
        if let Some(summary) = &unlisted {
            store.console.audit_add(summary)?;
        }
        store.console.audit_list(limit)
    })
    .await
    {
        Ok(e) => e,
        Err(e) => return fail(session, ex, &store_failed(&ex.request_id, &e)).await,
    };
    let data: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "time": local_time(e.time_ms, &jiff::tz::TimeZone::UTC),
                "user": e.user,
                "action": e.action,
                "key_id": e.key_id,
                "detail": serde_json::from_str::<Value>(&e.detail).unwrap_or(Value::Null),
            })
        })
        .collect();
    super::json(session, ex, &json!({"object": "list", "data": data})).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn console_routes() {
        assert_eq!(route(&Method::GET, "/"), Some(Route::Page));
        assert_eq!(route(&Method::GET, "/console"), Some(Route::Page));
        assert_eq!(route(&Method::POST, "/console/login"), Some(Route::Login));
        assert_eq!(route(&Method::GET, "/console/login"), None);
        assert_eq!(
            route(&Method::PATCH, "/console/api/keys/a%20b"),
            Some(Route::UpdateKey("a b".into()))
        );
        assert_eq!(
            route(&Method::POST, "/console/api/keys/k/rotate"),
            Some(Route::RotateKey("k".into()))
        );
        assert_eq!(route(&Method::POST, "/console/api/keys/k/other"), None);
        assert_eq!(route(&Method::GET, "/api/usage"), None);
    }
}
