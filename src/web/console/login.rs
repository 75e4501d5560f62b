//! Console sign-in: `[console] user` with `password_hash` (argon2id) or `password`, checked off
//! the runtime; failed attempts throttled per address, and across all addresses
//! (`guard`). A session is a random token in an
//! HttpOnly, SameSite=Strict cookie (Secure over TLS); the store keeps only its SHA-256, so
//! sessions survive a restart and a copy of the database cannot be replayed as a cookie.
//! State-changing calls also need a same-origin `Origin` or the page's CSRF token.

use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use pingora_proxy::Session;
use subtle::ConstantTimeEq;

use super::super::{Exchange, blocking, fail, store_failed};
use super::guard::Audit;
use crate::config::ConsoleConfig;
use crate::error::GatewayError;
use crate::store::console::{AuditEntry, Session as Stored};
use crate::web::Web;

pub const COOKIE: &str = "modelgate_session";

/// Password checks running at once.
static ARGON2_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
/// How long a session lasts from sign-in.
pub const SESSION_MS: i64 = 12 * 3600 * 1000;

/// A signed-in console user, for the request at hand.
pub struct SignedIn {
    pub user: String,
    pub csrf: String,
    pub token_sha256: String,
    pub expires_ms: i64,
}

/// What a session is bound to: the configured user and password (hash). A change to either
/// in the config ends every session made before it.
pub fn credential_tag(console: &ConsoleConfig) -> String {
    let material = format!(
        "{}\n{}\n{}",
        console.user,
        console.password_hash.as_deref().unwrap_or(""),
        console.password.as_ref().map_or("", |p| p.expose())
    );
    hex::encode(crate::config::keys::sha256(material.as_bytes()))
}

fn token_hash(token: &str) -> String {
    hex::encode(crate::config::keys::sha256(token.as_bytes()))
}

fn random_token(bytes: usize) -> String {
    let raw: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
    URL_SAFE_NO_PAD.encode(raw)
}

fn header<'a>(session: &'a Session, name: &str) -> Option<&'a str> {
    session
        .req_header()
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
}

/// The session cookie's value, if the request carries one.
fn cookie(session: &Session) -> Option<String> {
    session
        .req_header()
        .headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == COOKIE && !v.is_empty()).then(|| v.to_string())
        })
}

fn is_tls(session: &Session) -> bool {
    session.digest().is_some_and(|d| d.ssl_digest.is_some())
}

/// The session cookie is `Secure` when the browser reaches the console over https: this
/// listener's TLS, or a proxy's in front (`public_origin`).
fn secure(session: &Session, console: &ConsoleConfig) -> bool {
    is_tls(session)
        || console
            .public_origin
            .as_deref()
            .is_some_and(|o| o.starts_with("https://"))
}

/// `Origin` is absent, or names this very host and scheme.
fn origin_is_absent_or_same(session: &Session, console: &ConsoleConfig) -> bool {
    let Some(origin) = header(session, "origin") else {
        return true;
    };
    origin_matches(session, console, origin)
}

/// The page's origin is `public_origin` when set, or this listener's scheme and the host the
/// browser asked for: its `Host` header, or over HTTP/2 (which has none) the request's
/// `:authority`.
fn origin_matches(session: &Session, console: &ConsoleConfig, origin: &str) -> bool {
    if console
        .public_origin
        .as_deref()
        .is_some_and(|o| origin.eq_ignore_ascii_case(o))
    {
        return true;
    }
    let req = session.req_header();
    let host = header(session, "host")
        .or_else(|| req.uri.authority().map(|a| a.as_str()))
        .unwrap_or("");
    let scheme = if is_tls(session) { "https" } else { "http" };
    !host.is_empty() && origin.eq_ignore_ascii_case(&format!("{scheme}://{host}"))
}

/// The live session of this request, or None (also when the credentials changed since).
pub async fn current(
    web: &Web,
    session: &Session,
    console: &ConsoleConfig,
) -> Result<Option<SignedIn>, GatewayError> {
    let Some(token) = cookie(session) else {
        return Ok(None);
    };
    let hash = token_hash(&token);
    let store = web.store.clone();
    let h = hash.clone();
    let now = super::super::now_ms();
    let found = blocking(move || store.console.session_get(&h, now))
        .await
        .map_err(|e| store_failed("console", &e))?;
    let tag = credential_tag(console);
    Ok(found
        .filter(|s: &Stored| s.cred == tag)
        .map(|s: Stored| SignedIn {
            user: s.user,
            csrf: s.csrf,
            token_sha256: hash,
            expires_ms: s.expires_ms,
        }))
}

/// For a state-changing call: the session, and a same-origin `Origin` or its CSRF token.
pub fn check_csrf(
    session: &Session,
    console: &ConsoleConfig,
    who: &SignedIn,
) -> Result<(), GatewayError> {
    let origin_ok = header(session, "origin").is_some_and(|o| origin_matches(session, console, o));
    let token_ok = header(session, "x-csrf-token")
        .is_some_and(|t| bool::from(t.as_bytes().ct_eq(who.csrf.as_bytes())));
    if origin_ok || token_ok {
        Ok(())
    } else {
        Err(GatewayError::CrossSite)
    }
}

fn password_ok(console: &ConsoleConfig, user: &str, password: &str) -> bool {
    use argon2::{PasswordHash, PasswordVerifier};
    let user_ok = bool::from(user.as_bytes().ct_eq(console.user.as_bytes()));
    let pw_ok = match (&console.password_hash, &console.password) {
        (Some(hash), _) => PasswordHash::new(hash).is_ok_and(|h| {
            argon2::Argon2::default()
                .verify_password(password.as_bytes(), &h)
                .is_ok()
        }),
        (None, Some(secret)) => bool::from(password.as_bytes().ct_eq(secret.expose().as_bytes())),
        (None, None) => false,
    };
    user_ok && pw_ok
}

/// Whether a sign-in from `ip` may have its password checked now (after a wait, past the
/// failures all addresses may make); the refusal if not. Each attempt is counted before its
/// password is checked, so parallel attempts cannot slip past the limit; a right one is taken
/// back once it signed in. Returns the client's id for `Guard::signed_in`.
async fn sign_in_turn(
    web: &Web,
    ip: Option<std::net::IpAddr>,
    now: Instant,
) -> Result<Option<u64>, GatewayError> {
    let refused = |message: &str, wait| GatewayError::RateLimited {
        message: message.into(),
        retry_after: crate::limit::rate::retry_after_secs(wait),
        reason: "sign_ins",
    };
    if let Some(ip) = ip {
        if let Err(wait) = web.logins.begin(ip, now) {
            web.metrics.sign_in("throttled");
            let m = "Too many failed sign-ins from this address; try again later.";
            return Err(refused(m, wait));
        }
    }
    // Past the failures all addresses may make, a new address waits its turn.
    let client = ip.map(crate::auth::throttle::client_id);
    match web.sign_ins.turn(client, now) {
        Ok(None) => {}
        Ok(Some(wait)) => tokio::time::sleep(wait).await,
        Err(wait) => {
            if let Some(ip) = ip {
                // Its password was not checked: not a failure of its address.
                web.logins.forgive(ip);
            }
            web.metrics.sign_in("held");
            let m = "Too many failed sign-ins to this console; try again in a moment.";
            return Err(refused(m, wait));
        }
    }
    Ok(client)
}

/// `POST /console/login` `{"user","password"}` → 204 and the session cookie, or 401.
pub async fn login(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    console: &ConsoleConfig,
    body: &[u8],
) -> pingora_error::Result<()> {
    let now = Instant::now();
    let metric = |result: &str| {
        web.metrics.sign_in(result);
    };
    let client = match sign_in_turn(web, ex.client, now).await {
        Ok(client) => client,
        Err(e) => return fail(session, ex, &e).await,
    };
    if !origin_is_absent_or_same(session, console) {
        return fail(session, ex, &GatewayError::CrossSite).await;
    }
    let creds: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return fail(session, ex, &GatewayError::InvalidJson(e.to_string())).await,
    };
    let (Some(user), Some(password)) = (creds["user"].as_str(), creds["password"].as_str()) else {
        return fail(session, ex, &GatewayError::MissingParameter("password")).await;
    };
    let (c, u, p) = (console.clone(), user.to_string(), password.to_string());
    // argon2 takes tens of milliseconds of CPU and ~19 MiB: off the proxy's threads, and at
    // most a few at once whatever arrives.
    let ok = match ARGON2_SLOTS.acquire().await {
        Ok(_slot) => tokio::task::spawn_blocking(move || password_ok(&c, &u, &p))
            .await
            .unwrap_or(false),
        Err(_) => false,
    };
    if !ok {
        metric("failed");
        tracing::info!(client = ?ex.client, "console sign-in refused");
        audit_failed(web, ex.client, console, user, now);
        return fail(session, ex, &GatewayError::BadCredentials).await;
    }
    if let Some(ip) = ex.client {
        web.logins.forgive(ip);
    }
    web.sign_ins.signed_in(client);
    metric("ok");
    let token = random_token(32);
    let now_ms = super::super::now_ms();
    let stored = Stored {
        user: console.user.clone(),
        csrf: random_token(24),
        created_ms: now_ms,
        expires_ms: now_ms + SESSION_MS,
        cred: credential_tag(console),
    };
    let store = web.store.clone();
    let hash = token_hash(&token);
    let audit = AuditEntry {
        time_ms: now_ms,
        user: console.user.clone(),
        action: "login".into(),
        key_id: String::new(),
        detail: serde_json::json!({"client": ex.client.map(|c| c.to_string())}).to_string(),
    };
    let saved = blocking(move || {
        store.console.session_put(&hash, &stored)?;
        store.console.audit_add(&audit)
    })
    .await;
    if let Err(e) = saved {
        return fail(session, ex, &store_failed(&ex.request_id, &e)).await;
    }
    let secure = if secure(session, console) {
        "; Secure"
    } else {
        ""
    };
    let set = format!(
        "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        SESSION_MS / 1000
    );
    crate::http1::respond::send(
        session,
        ex.writing(),
        204,
        "application/json",
        Bytes::new(),
        |h| {
            h.insert_header("set-cookie", set)?;
            h.insert_header("cache-control", "no-store")
        },
    )
    .await
}

/// `POST /console/logout`: ends the session (also in the store) and clears the cookie.
pub async fn logout(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    who: &SignedIn,
) -> pingora_error::Result<()> {
    let store = web.store.clone();
    let hash = who.token_sha256.clone();
    let audit = AuditEntry {
        time_ms: super::super::now_ms(),
        user: who.user.clone(),
        action: "logout".into(),
        key_id: String::new(),
        detail: "{}".into(),
    };
    let done = blocking(move || {
        store.console.session_delete(&hash)?;
        store.console.audit_add(&audit)
    })
    .await;
    if let Err(e) = done {
        return fail(session, ex, &store_failed(&ex.request_id, &e)).await;
    }
    let clear = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    crate::http1::respond::send(
        session,
        ex.writing(),
        204,
        "application/json",
        Bytes::new(),
        |h| h.insert_header("set-cookie", clear),
    )
    .await
}

/// A failed sign-in in the audit log, where an operator looks for someone guessing: at most as
/// many entries as passwords can be checked (the throttle and the argon2 slots bound that). A
/// name other than the console's is not written: it may be a password typed in the wrong box.
fn audit_failed(
    web: &Web,
    client: Option<std::net::IpAddr>,
    console: &ConsoleConfig,
    user: &str,
    now: Instant,
) {
    let known = bool::from(user.as_bytes().ct_eq(console.user.as_bytes()));
    let audit = AuditEntry {
        time_ms: super::super::now_ms(),
        user: if known {
            console.user.clone()
        } else {
            String::new()
        },
        action: "login_failed".into(),
        key_id: String::new(),
        detail: serde_json::json!({
            "client": client.map(|c| c.to_string()),
            "reason": if known { "wrong password" } else { "unknown user" },
        })
        .to_string(),
    };
    // Written beside the answer, not before it (a locked store would hold the 401), and
    // at most `AUDITED_FAILURES` a minute one by one, whatever comes from how many
    // addresses: the rest are summed up in one entry.
    let entries = match web.sign_ins.failed(now) {
        Audit::Entry => vec![audit],
        Audit::Skip => Vec::new(),
        Audit::SummaryThenEntry(n) => vec![unlisted_summary(n, audit.time_ms), audit],
    };
    if !entries.is_empty() {
        let store = web.store.clone();
        // Owned by the store it writes to; the audit entries are bounded.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move {
            let written = blocking(move || {
                entries
                    .iter()
                    .try_for_each(|entry| store.console.audit_add(entry))
            })
            .await;
            if let Err(e) = written {
                tracing::warn!(error = %e, "console: a failed sign-in was not audited");
            }
        });
    }
}

/// The audit entry that sums up the failed sign-ins of a minute not listed one by one.
pub(super) fn unlisted_summary(n: u32, time_ms: i64) -> AuditEntry {
    AuditEntry {
        time_ms,
        user: String::new(),
        action: "login_failed_summary".into(),
        key_id: String::new(),
        detail: serde_json::json!({
            "failed_sign_ins_not_listed": n,
            "in_the_minute_before": true,
        })
        .to_string(),
    }
}
