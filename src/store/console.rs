//! Store stage, the console's own tables: login sessions (kept here so they survive a restart;
//! only the SHA-256 of a session token is stored) and the audit log of console actions, in
//! whichever engine holds the records (`sqlite/console.rs`, `postgres/`). Callers run these on
//! blocking threads.

use std::sync::Arc;

use super::StoreError;
use super::engine::Engine;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: String,
    /// The token the console page sends back in `x-csrf-token`.
    pub csrf: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    /// The credentials it was made with (`console::login::credential_tag`).
    pub cred: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub time_ms: i64,
    pub user: String,
    /// `create`, `update`, `delete`, `rotate`, `login`, `logout`.
    pub action: String,
    pub key_id: String,
    /// What changed, as JSON; never a secret.
    pub detail: String,
}

/// The console's tables in the store's engine.
pub struct Console(pub(super) Arc<dyn Engine>);

impl Console {
    pub fn session_put(&self, token_sha256: &str, s: &Session) -> Result<(), StoreError> {
        self.0.session_put(token_sha256, s)
    }

    /// The live session for a token's hash at `now_ms`.
    pub fn session_get(
        &self,
        token_sha256: &str,
        now_ms: i64,
    ) -> Result<Option<Session>, StoreError> {
        self.0.session_get(token_sha256, now_ms)
    }

    pub fn session_delete(&self, token_sha256: &str) -> Result<(), StoreError> {
        self.0.session_delete(token_sha256)
    }

    pub fn audit_add(&self, e: &AuditEntry) -> Result<(), StoreError> {
        self.0.audit_add(e)
    }

    /// The newest `limit` entries, newest first.
    pub fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        self.0.audit_list(limit)
    }
}
