//! `GET /v1/models` and `/v1/models/{id}`, answered from config and filtered by the key's
//! model permissions: in OpenAI's list shape, or in Anthropic's for an Anthropic client (its
//! SDK's `models.list()` and `models.retrieve()`).

use serde_json::{Value, json};

use crate::config::keys::Key;
use crate::error::ErrorShape;
use crate::route::{Route, Router};

fn object(r: &Route, created: i64, shape: ErrorShape) -> Value {
    match shape {
        ErrorShape::OpenAi => {
            json!({"id": r.model.name, "object": "model", "created": created, "owned_by": r.model.owned_by})
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
                "id": r.model.name,
                "display_name": r.model.name,
                "created_at": created_at,
            })
        }
    }
}

pub fn list(router: &Router, key: &Key, shape: ErrorShape) -> Vec<u8> {
    let data: Vec<Value> = router
        .ordered
        .iter()
        .filter(|r| key.may_use_model(&r.model.name))
        .map(|r| object(r, router.created, shape))
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
    let r = router
        .get(id)
        .filter(|r| key.may_use_model(&r.model.name))?;
    Some(object(r, router.created, shape).to_string().into_bytes())
}
