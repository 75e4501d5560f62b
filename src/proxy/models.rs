//! `GET /v1/models` and `/v1/models/{id}`, answered from config and filtered by the key's
//! model permissions: in OpenAI's list shape, or in Anthropic's for an Anthropic client (its
//! SDK's `models.list()` and `models.retrieve()`).

use serde_json::{Value, json};

use crate::config::keys::Key;
use crate::error::ErrorShape;
use crate::route::{Route, Router};

/// The model object of `id` (a name or alias of `r`'s entry, or an id its glob matches).
fn object(id: &str, r: &Route, created: i64, shape: ErrorShape) -> Value {
    match shape {
        ErrorShape::OpenAi => {
            json!({"id": id, "object": "model", "created": created, "owned_by": r.model.owned_by})
        }
        ErrorShape::Anthropic => {
            let created_at = time::OffsetDateTime::from_unix_timestamp(created)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .unwrap_or_else(|| "1970-01-01T00:00:00Z".into());
            json!({
                "type": "model",
                "id": id,
                "display_name": id,
                "created_at": created_at,
            })
        }
    }
}

/// The ids a key may use: each entry's name and aliases (a glob entry's aliases only).
pub fn list(router: &Router, key: &Key, shape: ErrorShape) -> Vec<u8> {
    let data: Vec<Value> = router
        .listed()
        .filter(|(id, r)| may_see(key, id, r))
        .map(|(id, r)| object(id, r, router.created, shape))
        .collect();
    let list = match shape {
        ErrorShape::OpenAi => json!({"object": "list", "data": data}),
        ErrorShape::Anthropic => {
            // One page: the whole list.
            let first_id = data.first().map(|m| m["id"].clone());
            let last_id = data.last().map(|m| m["id"].clone());
            json!({"data": data, "has_more": false, "first_id": first_id, "last_id": last_id})
        }
    };
    list.to_string().into_bytes()
}

/// The model object, or None when it does not exist or the key may not see it.
pub fn get(router: &Router, key: &Key, id: &str, shape: ErrorShape) -> Option<Vec<u8>> {
    let r = router.get(id).filter(|r| may_see(key, id, r))?;
    Some(
        object(id, r, router.created, shape)
            .to_string()
            .into_bytes(),
    )
}

/// Whether a key may use `id` of `r`'s entry: by that id, or (an alias) by the entry's name.
pub fn may_see(key: &Key, id: &str, r: &Route) -> bool {
    key.may_use_model(id)
        || (r.model.aliases.iter().any(|a| a == id) && key.may_use_model(&r.model.name))
}
