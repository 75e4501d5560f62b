//! Store stage, the one interface a store engine implements (SQLite embedded, Postgres for a
//! fleet). `Store` owns what every engine shares (the channel, the overflow queue, the writer
//! thread and its counters); an engine only commits batches and answers reads.

use std::collections::HashMap;

use bytes::Bytes;

use super::StoreError;
use super::console::{AuditEntry, Session};
use super::query::{Page, Query};
use super::record::UsageRecord;
use super::rollup::{Rollup, RollupQuery};

/// A batch that did not commit. A transient one (the database server unreachable, restarting
/// or busy) is kept and retried until it commits, while newer records wait in the spool on
/// disk; any other is retried once and then counted lost.
#[derive(Debug)]
pub(crate) struct WriteError {
    pub msg: String,
    pub transient: bool,
}

impl From<String> for WriteError {
    /// An error of the embedded store: a full or broken disk does not heal by waiting.
    fn from(msg: String) -> WriteError {
        WriteError {
            msg,
            transient: false,
        }
    }
}

/// What the writer thread does with its batches; owned by that thread alone.
pub(crate) trait BatchWriter: Send {
    /// Commits one batch with its spend and rollups, all or nothing. On a database server, a
    /// row whose `request_id` is already stored is skipped, so a batch retried after a lost
    /// acknowledgement is never counted twice (SQLite's commit has no lost acknowledgement).
    fn insert_batch(&mut self, batch: &[UsageRecord]) -> Result<(), WriteError>;

    /// `insert_batch` for a batch replayed from the spool, which may hold records already
    /// committed (a crash between a batch's commit and the spool's note of it).
    fn insert_replayed(&mut self, batch: &[UsageRecord]) -> Result<(), WriteError> {
        self.insert_batch(batch)
    }

    /// The records of `batch` not stored yet, where the store can tell (SQLite, Postgres: by
    /// request id); else all of them.
    fn not_stored(&mut self, batch: &[UsageRecord]) -> Vec<UsageRecord> {
        batch.to_vec()
    }

    /// Deletes at most one chunk of rows older than `cutoff_ms` (spend is kept); returns
    /// whether more may remain.
    fn delete_expired(&mut self, cutoff_ms: i64) -> Result<bool, WriteError>;

    /// Makes the batches committed so far survive a power loss, before the journal's lines of
    /// their records are removed. A database server's commit already does; SQLite's log (WAL
    /// with `synchronous=NORMAL`) is synced at checkpoints only, so it is synced here.
    fn durable(&mut self) -> Result<(), WriteError> {
        Ok(())
    }

    /// The writer has been idle a while: give back memory kept to make batches fast (SQLite's
    /// page cache), so RSS returns to its level before a burst. The next batch reads back the
    /// few pages it needs.
    fn release_memory(&mut self) {}
}

/// Reads, for the usage API, the page, the console and the start-up loads. Blocking: callers
/// run them on blocking threads.
pub(crate) trait Engine: Send + Sync {
    /// One keyset page, see `Query`.
    fn page(&self, q: &Query) -> Result<Page, StoreError>;

    /// Streams `CSV_HEADER\n` then every matching row (ordered like `page`) to `sink` in
    /// chunks of about 64 KiB, memory flat; stops early when `sink` returns false. Returns the
    /// rows in chunks handed to `sink`.
    fn export_csv(&self, q: &Query, sink: &mut dyn FnMut(Bytes) -> bool)
    -> Result<u64, StoreError>;

    /// The rollup of a range, exact for any `start`/`end`.
    fn rollup(&self, q: &RollupQuery) -> Result<Rollup, StoreError>;

    /// key_id → total spend.
    fn spend_totals(&self) -> Result<HashMap<String, f64>, StoreError>;

    /// key_id → unix ms of its last committed request.
    fn last_used(&self) -> Result<HashMap<String, i64>, StoreError>;

    /// The console's sessions and audit log.
    fn session_put(&self, token_sha256: &str, s: &Session) -> Result<(), StoreError>;
    fn session_get(&self, token_sha256: &str, now_ms: i64) -> Result<Option<Session>, StoreError>;
    fn session_delete(&self, token_sha256: &str) -> Result<(), StoreError>;
    fn audit_add(&self, e: &AuditEntry) -> Result<(), StoreError>;
    fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError>;

    /// Called once the writer has stopped: idle connections are closed, later reads open
    /// their own.
    fn close(&self);
}
