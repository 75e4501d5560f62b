//! Store stage, the console's tables on SQLite: their writes are rare, so they go through one
//! small connection of their own; WAL lets it commit between the usage writer's batches.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use crate::store::StoreError;
use crate::store::console::{AuditEntry, Session};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS console_sessions (
    token_sha256 TEXT PRIMARY KEY NOT NULL,
    user TEXT NOT NULL,
    csrf TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    cred TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS console_audit (
    time_ms INTEGER NOT NULL,
    user TEXT NOT NULL,
    action TEXT NOT NULL,
    key_id TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS console_audit_time ON console_audit (time_ms);
";

/// The SQLite side: one connection of its own.
pub(in crate::store) struct SqliteConsole {
    conn: Mutex<Connection>,
}

fn q(e: rusqlite::Error) -> StoreError {
    StoreError::query(e)
}

impl SqliteConsole {
    pub(in crate::store) fn open(path: &Path) -> Result<SqliteConsole, String> {
        let conn = Connection::open(path)
            .map_err(|e| format!("console store: opening {}: {e}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| format!("console store: busy_timeout: {e}"))?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| format!("console store: creating schema: {e}"))?;
        Ok(SqliteConsole {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn session_put(&self, token_sha256: &str, s: &Session) -> Result<(), StoreError> {
        let c = self.conn();
        // Expired sessions go as new ones come: the table never grows without bound.
        c.execute(
            "DELETE FROM console_sessions WHERE expires_ms <= ?1",
            params![s.created_ms],
        )
        .map_err(q)?;
        c.execute(
            "INSERT OR REPLACE INTO console_sessions (token_sha256, user, csrf, created_ms, \
             expires_ms, cred) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                token_sha256,
                s.user,
                s.csrf,
                s.created_ms,
                s.expires_ms,
                s.cred
            ],
        )
        .map_err(q)?;
        Ok(())
    }

    /// The live session for a token's hash at `now_ms`.
    pub fn session_get(
        &self,
        token_sha256: &str,
        now_ms: i64,
    ) -> Result<Option<Session>, StoreError> {
        self.conn()
            .query_row(
                "SELECT user, csrf, created_ms, expires_ms, cred FROM console_sessions \
                 WHERE token_sha256 = ?1 AND expires_ms > ?2",
                params![token_sha256, now_ms],
                |r| {
                    Ok(Session {
                        user: r.get(0)?,
                        csrf: r.get(1)?,
                        created_ms: r.get(2)?,
                        expires_ms: r.get(3)?,
                        cred: r.get(4)?,
                    })
                },
            )
            .optional()
            .map_err(q)
    }

    pub fn session_delete(&self, token_sha256: &str) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "DELETE FROM console_sessions WHERE token_sha256 = ?1",
                params![token_sha256],
            )
            .map_err(q)?;
        Ok(())
    }

    pub fn audit_add(&self, e: &AuditEntry) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "INSERT INTO console_audit (time_ms, user, action, key_id, detail) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![e.time_ms, e.user, e.action, e.key_id, e.detail],
            )
            .map_err(q)?;
        Ok(())
    }

    /// The newest `limit` entries, newest first.
    pub fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let c = self.conn();
        let mut stmt = c
            .prepare_cached(
                "SELECT time_ms, user, action, key_id, detail FROM console_audit \
                 ORDER BY time_ms DESC, rowid DESC LIMIT ?1",
            )
            .map_err(q)?;
        let rows = stmt
            .query_map(params![i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
                Ok(AuditEntry {
                    time_ms: r.get(0)?,
                    user: r.get(1)?,
                    action: r.get(2)?,
                    key_id: r.get(3)?,
                    detail: r.get(4)?,
                })
            })
            .map_err(q)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(q)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sessions_survive_reopening_and_expire() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        let s = Session {
            user: "admin".into(),
            csrf: "c".into(),
            created_ms: 1_000,
            expires_ms: 5_000,
            cred: "t".into(),
        };
        SqliteConsole::open(&path)
            .unwrap()
            .session_put("h", &s)
            .unwrap();
        let db = SqliteConsole::open(&path).unwrap();
        assert_eq!(db.session_get("h", 2_000).unwrap(), Some(s));
        assert_eq!(db.session_get("h", 5_000).unwrap(), None);
        assert_eq!(db.session_get("other", 2_000).unwrap(), None);
        db.session_delete("h").unwrap();
        assert_eq!(db.session_get("h", 2_000).unwrap(), None);
        for i in 0..3 {
            db.audit_add(&AuditEntry {
                time_ms: i,
                user: "admin".into(),
                action: "update".into(),
                key_id: format!("k{i}"),
                detail: "{}".into(),
            })
            .unwrap();
        }
        let list = db.audit_list(2).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].key_id, "k2");
    }
}
