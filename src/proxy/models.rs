//! `GET /v1/models` and `/v1/models/{id}`, answered from config and filtered by the key's
//! model permissions, in OpenAI's list shape.

use serde_json::{Value, json};

use crate::config::keys::Key;
use crate::route::{Route, Router};

fn object(r: &Route, created: i64) -> Value {
    json!({"id": r.model.name, "object": "model", "created": created, "owned_by": r.pool.name})
}

pub fn list(router: &Router, key: &Key) -> Vec<u8> {
    let data: Vec<Value> = router
        .ordered
        .iter()
        .filter(|r| key.may_use_model(&r.model.name))
        .map(|r| object(r, router.created))
        .collect();
    json!({"object": "list", "data": data})
        .to_string()
        .into_bytes()
}

/// The model object, or None when it does not exist or the key may not see it.
pub fn get(router: &Router, key: &Key, id: &str) -> Option<Vec<u8>> {
    let r = router
        .get(id)
        .filter(|r| key.may_use_model(&r.model.name))?;
    Some(object(r, router.created).to_string().into_bytes())
}
