//! Console keys API: list (never a secret: its hint only), create (the secret is answered once;
//! only its SHA-256 is kept), edit, disable, delete and rotate. Every change goes through the
//! config stage's keys editor (of the keys file, or of the Postgres keys table for a fleet) and
//! is applied right away, so the file or table stays the one source of truth; each leaves an audit entry naming the fields it changed.

use std::sync::Arc;

use pingora_proxy::Session;
use serde_json::{Map, Value, json};

use super::super::summary::{key_json, local_time};
use super::super::{Exchange, blocking, fail, store_failed};
use super::login::SignedIn;
use crate::config::keys::{Key, new_secret, secret_hint, sha256};
use crate::config::keys_file::{self, Edit, EditError};
use crate::error::GatewayError;
use crate::route::endpoint::Group;
use crate::store::console::AuditEntry;
use crate::store::postgres::keys as keys_table;
use crate::web::Web;

/// One key as the console shows it.
pub fn key_view(key: &Key, spend: f64, last_used_ms: Option<i64>) -> Value {
    let mut v = key_json(key, spend);
    v["hint"] = json!(key.hint);
    v["endpoints"] = json!(
        Group::ALL
            .iter()
            .filter(|g| key.may_use(**g))
            .map(|g| g.name())
            .collect::<Vec<_>>()
    );
    v["last_used"] = json!(
        last_used_ms
            .filter(|t| *t > 0)
            .map(|t| local_time(t, &jiff::tz::TimeZone::UTC))
    );
    v
}

fn find(web: &Web, id: &str) -> Option<Arc<Key>> {
    web.live
        .snapshot()
        .keys
        .keys()
        .find(|k| k.id == id)
        .cloned()
}

pub async fn list(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
) -> pingora_error::Result<()> {
    let store = web.store.clone();
    let last = match blocking(move || store.last_used()).await {
        Ok(l) => l,
        Err(e) => return fail(session, ex, &store_failed(&ex.request_id, &e)).await,
    };
    let snapshot = web.live.snapshot();
    let table = &snapshot.keys;
    let mut keys: Vec<&Arc<Key>> = table.keys().collect();
    keys.sort_by(|a, b| a.id.cmp(&b.id));
    let data: Vec<Value> = keys
        .iter()
        .map(|k| key_view(k, web.spend.get(&k.id), last.get(&k.id).copied()))
        .collect();
    super::super::json(session, ex, &json!({"object": "list", "data": data})).await
}

fn edit_error(e: EditError) -> GatewayError {
    match e {
        EditError::NotFound(id) => GatewayError::NotFound(format!("/console/api/keys/{id}")),
        EditError::Exists(id) => {
            GatewayError::Conflict(format!("A key with id '{id}' exists already."))
        }
        EditError::Invalid(m) => GatewayError::InvalidParameter {
            param: "key",
            message: m,
        },
        EditError::Io(m) => {
            tracing::error!("keys file edit failed: {m}");
            GatewayError::Internal("The keys file could not be written.".into())
        }
    }
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Writes the edit, reloads the keys at once, and records it in the audit log.
async fn write(
    web: &Web,
    who: &SignedIn,
    action: &str,
    id: &str,
    detail: Value,
    edit: Edit,
) -> Result<(), GatewayError> {
    let config = web.live.fixed.clone();
    let table = tokio::task::spawn_blocking(move || match &config.storage.postgres {
        Some(url) if config.keys.in_postgres => keys_table::apply(url.expose(), &edit),
        _ => keys_file::apply(&config.keys.file, &edit),
    })
    .await
    .map_err(|e| GatewayError::Internal(format!("keys file edit: {e}")))?
    .map_err(edit_error)?;
    // In force now, as written (the watcher's reload of the same file changes nothing).
    web.live.set_keys(table);
    let store = web.store.clone();
    let entry = AuditEntry {
        time_ms: super::super::now_ms(),
        user: who.user.clone(),
        action: action.into(),
        key_id: id.into(),
        detail: detail.to_string(),
    };
    blocking(move || store.console.audit_add(&entry))
        .await
        .map_err(|e| store_failed("console", &e))
}

fn object(body: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(GatewayError::InvalidJson("expected a JSON object".into())),
        Err(e) => Err(GatewayError::InvalidJson(e.to_string())),
    }
}

fn fresh_secret() -> (String, String, String) {
    let secret = new_secret();
    let sha = hex::encode(sha256(secret.as_bytes()));
    let hint = secret_hint(&secret);
    (secret, sha, hint)
}

async fn answer_key(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    id: &str,
    secret: Option<String>,
) -> pingora_error::Result<()> {
    let key = find(web, id).map(|k| key_view(&k, web.spend.get(&k.id), None));
    let mut body = json!({"id": id, "key": key});
    if let Some(s) = secret {
        body["secret"] = json!(s);
    }
    super::super::json(session, ex, &body).await
}

pub async fn create(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    who: &SignedIn,
    body: &[u8],
) -> pingora_error::Result<()> {
    let mut fields = match object(body) {
        Ok(f) => f,
        Err(e) => return fail(session, ex, &e).await,
    };
    let id = match fields.remove("id") {
        Some(Value::String(id)) if valid_id(&id) => id,
        Some(_) => {
            let e = GatewayError::InvalidParameter {
                param: "id",
                message: "id is 1 to 64 letters, digits, '-', '_' or '.'".into(),
            };
            return fail(session, ex, &e).await;
        }
        None => return fail(session, ex, &GatewayError::MissingParameter("id")).await,
    };
    let (secret, secret_sha256, hint) = fresh_secret();
    let detail = Value::Object(fields.clone());
    let edit = Edit::Create {
        id: id.clone(),
        secret_sha256,
        hint,
        fields,
    };
    if let Err(e) = write(web, who, "create", &id, detail, edit).await {
        return fail(session, ex, &e).await;
    }
    answer_key(web, session, ex, &id, Some(secret)).await
}

pub async fn update(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    who: &SignedIn,
    id: &str,
    body: &[u8],
) -> pingora_error::Result<()> {
    let fields = match object(body) {
        Ok(f) => f,
        Err(e) => return fail(session, ex, &e).await,
    };
    let detail = Value::Object(fields.clone());
    let edit = Edit::Update {
        id: id.into(),
        fields,
    };
    if let Err(e) = write(web, who, "update", id, detail, edit).await {
        return fail(session, ex, &e).await;
    }
    answer_key(web, session, ex, id, None).await
}

pub async fn delete(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    who: &SignedIn,
    id: &str,
) -> pingora_error::Result<()> {
    let edit = Edit::Delete { id: id.into() };
    if let Err(e) = write(web, who, "delete", id, json!({}), edit).await {
        return fail(session, ex, &e).await;
    }
    super::super::json(session, ex, &json!({"id": id, "deleted": true})).await
}

pub async fn rotate(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    who: &SignedIn,
    id: &str,
) -> pingora_error::Result<()> {
    let (secret, secret_sha256, hint) = fresh_secret();
    let edit = Edit::Rotate {
        id: id.into(),
        secret_sha256,
        hint: hint.clone(),
    };
    if let Err(e) = write(web, who, "rotate", id, json!({"hint": hint}), edit).await {
        return fail(session, ex, &e).await;
    }
    answer_key(web, session, ex, id, Some(secret)).await
}
