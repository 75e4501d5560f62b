//! Store stage: usage records and spend, kept off the request path. `record` hands a record to
//! one writer thread (bounded channel, then an in-memory overflow queue) that commits batches
//! to the store's engine (SQLite embedded, or Postgres); queries and CSV exports read through
//! the engine's own connections.

pub mod console;
pub mod journal;
pub mod line;
pub mod record;
pub mod rollup;

mod bounded;
mod engine;
pub mod postgres;
mod query;
mod spool;
mod sqlite;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use query::{Cursor, Page, Query};
pub use record::{CSV_HEADER, RecordRef, UsageRecord};

use engine::{BatchWriter, Engine};
use spool::Spool;
use writer::{Msg, Shared, Writer, WriterConfig};

/// Reads back what a journal left (a run that did not stop cleanly), puts its records in the
/// spool (without one, straight into the database, skipping those it has), removes it, and
/// opens a new one.
fn recover_journal(
    dir: &Path,
    spool: Option<&Path>,
    conn: &mut dyn BatchWriter,
) -> Result<Arc<journal::Journal>, String> {
    let (records, segments) = journal::recover(dir)?;
    if !records.is_empty() {
        let crashed = records.iter().filter(|r| r.cut == "crash").count();
        match spool {
            Some(path) => Spool::new(path.to_path_buf()).append(&records)?,
            None => conn.insert_replayed(&records).map_err(|e| e.msg)?,
        }
        tracing::warn!(
            records = records.len(),
            crashed,
            "usage journal: the records of a run that did not stop cleanly are recovered"
        );
    }
    for path in segments {
        std::fs::remove_file(&path)
            .map_err(|e| format!("usage journal: removing {}: {e}", path.display()))?;
    }
    journal::Journal::open(dir)
}

/// A failed read of the store. Its detail is for the log; clients get a generic message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl StoreError {
    pub(crate) fn query(e: rusqlite::Error) -> StoreError {
        StoreError(format!("usage store: query: {e}"))
    }
}

impl From<String> for StoreError {
    fn from(s: String) -> StoreError {
        StoreError(s)
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Records the channel holds before `record` spills to the overflow queue.
    pub channel_capacity: usize,
    /// Most rows per transaction.
    pub batch_max: usize,
    /// Longest a record waits in a part-filled batch before it is committed.
    pub batch_interval: Duration,
    /// Rows older than this are deleted (spend is kept); None keeps them forever.
    pub retention: Option<Duration>,
    /// Records that wait in memory (the overflow queue, and batches neither the database nor
    /// the spool could take) past which the store is full: new requests are refused
    /// (`refuse_when_full`), or further records dropped (counted, logged).
    pub overflow_max: usize,
    /// `on_store_full = "refuse"` (default): past `overflow_max` the gateway refuses new
    /// requests and drops no record; false: it serves them and drops their records (counted).
    pub refuse_when_full: bool,
    /// The spool takes no batch past this many bytes waiting in it (then they wait in memory).
    pub spool_max_bytes: u64,
    /// Where batches wait on disk while a database server is away (Postgres).
    pub spool: Option<PathBuf>,
    /// The crash journal's folder (`journal`); None: records wait in memory only.
    pub journal: Option<PathBuf>,
    /// Where the writer counts its batches (rows, time); None: not counted.
    pub metrics: Option<Arc<crate::ops::metrics::Metrics>>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            channel_capacity: 65_536,
            batch_max: 4_096,
            batch_interval: Duration::from_millis(100),
            retention: None,
            overflow_max: 200_000,
            refuse_when_full: true,
            spool_max_bytes: 1 << 30,
            spool: None,
            journal: None,
            metrics: None,
        }
    }
}

pub use crate::ops::metrics::StoreStats;

pub struct Store {
    engine: Arc<dyn Engine>,
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
    overflow_max: usize,
    refuse_when_full: bool,
    /// Requests refused because the store was full.
    refused: AtomicU64,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Set by `close`; `record` calls that see it drop their record instead of queueing it.
    closed: AtomicBool,
    /// `record` calls past the `closed` check; `close` waits for them before sending `Stop`,
    /// so nothing can be queued behind it.
    in_flight: AtomicUsize,
    /// The console's sessions and audit log, in the same store.
    pub console: console::Console,
    /// The writer thread, woken early (it sleeps while a batch fills) when a full batch is
    /// queued, the channel is full, or a flush or stop is sent.
    writer_thread: std::thread::Thread,
    batch_max: usize,
    /// Each key's spend when the store opened: the database's totals and the costs of the
    /// records waiting in the spool, read before the writer could replay any of them.
    spend_at_open: Mutex<Option<HashMap<String, f64>>>,
    journal: Option<Arc<journal::Journal>>,
}

/// Batches queued for the writer past which each new record's thread gives way to it.
const BEHIND_BATCHES: usize = 2;

/// The writer is behind by more than `BEHIND_BATCHES` whole batches: the calling (proxy)
/// thread gives up the rest of its turn on the CPU, so a writer that waits for that CPU runs.
/// The writer gives its core away every 16 rows of a batch (`sqlite::YIELD_EVERY`), so that a
/// request arriving meanwhile waits a few dozen µs, not the batch. Where it shares that core
/// with a proxy thread that never idles (one core, or the benchmark's pin), each of those
/// yields handed the proxy a whole turn: the writer ran 2.7% of the time under a plain-chat
/// load, too little, so its queue grew by about 7 MB a second for as long as the load lasted
/// (toward `overflow_max`, and then records are dropped), and its work was paid after the
/// load rather than during it. The proxy now gives the turn back while the writer is behind:
/// the queue stays about two batches long, and requests pay for their records as they go. A
/// writer with a core of its own is not waiting for this one, and the call returns at once.
fn give_way() {
    std::thread::yield_now();
}

/// A Postgres connection on the store's schema (migrated first), for the keys kept there.
pub fn postgres_client(url: &str) -> Result<::postgres::Client, String> {
    postgres::migrated_client(url)
}

/// Whether the SQLite store at `path` can be opened (checked by `check`, which writes
/// nothing): a database file, or a place one can be made; not a folder or another file.
pub fn check_sqlite_path(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(format!(
            "{} is a folder, not a database file",
            path.display()
        )),
        Ok(_) => {
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .and_then(|c| c.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(())))
                .map_err(|e| format!("{} cannot be opened as a database: {e}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Made at start, with its folders: the nearest folder that exists must be one.
            let mut up = path.parent();
            while let Some(dir) = up.filter(|d| !d.as_os_str().is_empty()) {
                match std::fs::metadata(dir) {
                    Ok(m) if m.is_dir() => return Ok(()),
                    Ok(_) => return Err(format!("{} is not a folder", dir.display())),
                    Err(_) => up = dir.parent(),
                }
            }
            Ok(())
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The longest a database server is waited for on one batch before the batch goes to the
/// spool (see `bounded`).
const DB_WRITE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Store {
    /// The embedded store: creates parent folders, opens/creates the SQLite file (WAL,
    /// synchronous=NORMAL, busy_timeout 5 s) and its schema, starts the writer thread.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<Arc<Store>, String> {
        let (engine, writer) = sqlite::SqliteEngine::open(path)?;
        Store::start(Arc::new(engine), Box::new(writer), opts)
    }

    /// The fleet's store: connects to Postgres (`postgres://…` or `key=value` settings),
    /// migrates its schema, starts the writer thread. Batches wait in `opts.spool` while the
    /// server is away.
    pub fn open_postgres(url: &str, opts: StoreOptions) -> Result<Arc<Store>, String> {
        let (engine, writer) = postgres::PgEngine::open(url)?;
        let writer = bounded::Bounded::new(writer, DB_WRITE_LIMIT)?;
        Store::start(Arc::new(engine), Box::new(writer), opts)
    }

    /// Starts the writer thread on `conn` in front of `engine`.
    fn start(
        engine: Arc<dyn Engine>,
        mut conn: Box<dyn BatchWriter>,
        opts: StoreOptions,
    ) -> Result<Arc<Store>, String> {
        let mut spend = engine.spend_totals().map_err(|e| e.to_string())?;
        let journal = match &opts.journal {
            Some(dir) => Some(recover_journal(dir, opts.spool.as_deref(), conn.as_mut())?),
            None => None,
        };
        if let Some(path) = &opts.spool {
            match Spool::new(path.clone()).pending_costs(|b| conn.not_stored(b)) {
                Ok(costs) => {
                    for (key, cost) in costs {
                        *spend.entry(key).or_insert(0.0) += cost;
                    }
                }
                // The writer meets it again and says so; the gateway starts.
                Err(e) => tracing::error!("{e}: the spend of the records in it is not counted"),
            }
        }
        let (tx, rx) = mpsc::sync_channel(opts.channel_capacity.max(1));
        let shared = Arc::new(Shared::default());
        let cfg = WriterConfig {
            batch_max: opts.batch_max.max(1),
            batch_interval: opts.batch_interval,
            retention: opts.retention,
            spool: opts.spool.clone(),
            spool_max_bytes: opts.spool_max_bytes,
            memory_max: opts.overflow_max,
            refuse_when_full: opts.refuse_when_full,
            metrics: opts.metrics.clone(),
        };
        let writer = Writer::new(conn, rx, Arc::clone(&shared), cfg, journal.clone());
        let handle = std::thread::Builder::new()
            .name("usage-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| format!("usage store: starting the writer thread: {e}"))?;
        let writer_thread = handle.thread().clone();
        if let Some(j) = &journal {
            j.wake_with(writer_thread.clone());
        }
        Ok(Arc::new(Store {
            writer_thread,
            batch_max: opts.batch_max.max(1),
            console: console::Console(Arc::clone(&engine)),
            engine,
            tx,
            shared,
            overflow_max: opts.overflow_max,
            refuse_when_full: opts.refuse_when_full,
            refused: AtomicU64::new(0),
            writer: Mutex::new(Some(handle)),
            closed: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            spend_at_open: Mutex::new(Some(spend)),
            journal,
        }))
    }

    /// Opens the journal entry of a request that passed auth (see `journal`): written once
    /// the entry's `durable` returns.
    /// Whether requests are journaled (`[storage] journal`).
    pub fn journals(&self) -> bool {
        self.journal.is_some()
    }

    pub fn journal_open(&self, opened: journal::OpenedRef<'_>) -> Option<journal::Entry> {
        self.journal.as_ref()?.open_entry(opened)
    }

    /// `record`, closing the request's journal entry with the record first (`written`: the
    /// journal has this record already).
    pub async fn record_journaled(
        &self,
        r: UsageRecord,
        mut entry: Option<journal::Entry>,
        written: bool,
    ) {
        if let (Some(e), false) = (&mut entry, written) {
            e.preclose(&r.borrowed()).await;
        }
        self.record(r);
        // Only once the record is queued: a segment goes when all its entries are closed, after
        // the writer has taken what is queued.
        drop(entry);
    }

    /// Never blocks, never panics. Channel → overflow queue → counted drop. After `close`
    /// the record is dropped (counted in `dropped`, logged).
    pub fn record(&self, r: UsageRecord) {
        let s = &self.shared;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.drop_record("the usage store is closed");
            return;
        }
        s.accepted.fetch_add(1, Ordering::SeqCst);
        // Counted before the send: the writer, which counts each record it takes off, never
        // gets ahead of this count (which would wrap it around).
        let queued = s.pending.fetch_add(1, Ordering::Relaxed) + 1;
        match self.tx.try_send(Msg::Record(Box::new(r))) {
            Ok(()) => {
                if queued == self.batch_max {
                    // A whole batch is waiting: no need for the writer to sleep out its
                    // interval.
                    self.writer_thread.unpark();
                } else if queued > BEHIND_BATCHES * self.batch_max {
                    give_way();
                }
            }
            Err(TrySendError::Full(msg)) => {
                s.pending.fetch_sub(1, Ordering::Relaxed);
                if let Msg::Record(r) = msg {
                    self.spill(r);
                }
            }
            Err(TrySendError::Disconnected(_)) => {
                s.pending.fetch_sub(1, Ordering::Relaxed);
                s.accepted.fetch_sub(1, Ordering::SeqCst);
                self.drop_record("the usage writer thread is gone");
            }
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// The channel is full: queue in memory for the writer, or drop (counted) past
    /// `overflow_max`.
    fn spill(&self, r: Box<UsageRecord>) {
        let s = &self.shared;
        self.writer_thread.unpark();
        give_way();
        let mut q = s.overflow();
        // With `on_store_full = "refuse"` no record is dropped: new requests are refused
        // instead (`refuses`), so only those in flight add to the queue past its bound.
        let waiting = q.len() + s.held.load(Ordering::Relaxed) as usize;
        if self.refuse_when_full || waiting < self.overflow_max {
            q.push_back(r);
            let len = q.len();
            s.overflow_len.store(len as u64, Ordering::Relaxed);
            drop(q);
            let total = s.overflowed.fetch_add(1, Ordering::Relaxed) + 1;
            if s.spill_log.allow() {
                tracing::warn!(
                    overflow_len = len,
                    overflowed_total = total,
                    "usage channel full; records wait in the overflow queue"
                );
            }
            return;
        }
        drop(q);
        s.accepted.fetch_sub(1, Ordering::SeqCst);
        self.drop_record("the usage overflow queue is full");
    }

    fn drop_record(&self, why: &str) {
        let total = self.shared.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if self.shared.drop_log.allow() {
            tracing::error!(dropped_total = total, "usage record dropped: {why}");
        }
    }

    /// key_id → total spend, from the spend table (for loading at start).
    pub fn spend_totals(&self) -> Result<HashMap<String, f64>, StoreError> {
        self.engine.spend_totals()
    }

    /// Each key's spend when the store opened, records waiting in the spool included (once;
    /// later, `spend_totals`).
    pub fn spend_at_open(&self) -> HashMap<String, f64> {
        self.spend_at_open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
    }

    /// key_id → unix ms of its last committed request (for loading at start).
    pub fn last_used(&self) -> Result<HashMap<String, i64>, StoreError> {
        self.engine.last_used()
    }

    /// Drains the channel and the overflow queue, commits, stops and joins the writer.
    /// Idempotent; a concurrent second call waits for the first. Records sent after close
    /// are dropped and counted in `dropped`.
    pub fn close(&self) {
        // A test that failed while the writer was paused must still be able to drop the store.
        #[cfg(test)]
        self.shared.paused.store(false, Ordering::SeqCst);
        let mut handle = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        self.closed.store(true, Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        if let Some(h) = handle.take() {
            if self.tx.send(Msg::Stop).is_err() {
                tracing::error!("usage store: the writer thread was already gone at close");
            }
            self.writer_thread.unpark();
            if h.join().is_err() {
                tracing::error!("usage store: the writer thread panicked");
            }
        }
        drop(handle);
        self.engine.close();
    }

    /// Blocks until everything recorded before the call is committed (for tests and for
    /// close). Returns false on timeout.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (ack_tx, ack_rx) = mpsc::channel();
        let mut msg = Msg::Flush(ack_tx);
        // The marker queues behind every record sent before it; a full channel means the
        // writer is busy emptying it, so retry briefly.
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => {
                    self.writer_thread.unpark();
                    break;
                }
                Err(TrySendError::Full(m)) => {
                    if Instant::now() >= deadline {
                        return false;
                    }
                    msg = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TrySendError::Disconnected(_)) => return self.closed.load(Ordering::SeqCst),
            }
        }
        match ack_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => false,
            // The writer stopped without reading the marker: `close` drained everything.
            Err(RecvTimeoutError::Disconnected) => self.closed.load(Ordering::SeqCst),
        }
    }

    /// Whether records are being written: the last batch committed (or none was tried yet)
    /// and the store is not closed.
    pub fn writable(&self) -> bool {
        !self.shared.failing.load(Ordering::Relaxed)
    }

    /// Past its bound: as many records wait in memory (the overflow queue, and batches that
    /// neither the database nor the spool takes) as `overflow_max`.
    pub fn full(&self) -> bool {
        let s = &self.shared;
        s.held.load(Ordering::Relaxed) + s.overflow_len.load(Ordering::Relaxed)
            >= self.overflow_max as u64
    }

    /// Whether a new request is to be refused (503 `usage_store_unavailable`): the store is
    /// full and `on_store_full = "refuse"`. A refusal is counted.
    pub fn refuses(&self) -> bool {
        if self.refuse_when_full && self.full() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    pub fn stats(&self) -> StoreStats {
        let s = &self.shared;
        let written = s.written.load(Ordering::SeqCst);
        let write_errors = s.write_errors.load(Ordering::SeqCst);
        let accepted = s.accepted.load(Ordering::SeqCst);
        StoreStats {
            written,
            overflowed: s.overflowed.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            queued: accepted.saturating_sub(written + write_errors),
            write_errors,
            spool_bytes: s.spool_bytes.load(Ordering::Relaxed),
            spooled: s.spooled.load(Ordering::Relaxed),
            held: s.held.load(Ordering::Relaxed),
            full: self.full(),
            refused: self.refused.load(Ordering::Relaxed),
            journal_failures: self
                .journal
                .as_ref()
                .map_or(0, |j| j.failures.load(Ordering::Relaxed)),
        }
    }

    /// Times the writer, idle for a second after writing, gave its page cache back.
    pub fn memory_releases(&self) -> u64 {
        self.shared.memory_releases.load(Ordering::Relaxed)
    }

    /// Blocking (callers use spawn_blocking). One page ordered by (time_ms, seq).
    pub fn query(&self, q: &Query) -> Result<Page, StoreError> {
        self.engine.page(q)
    }

    /// Blocking. Streams `CSV_HEADER\n` then every matching row (ordered like `query`) to
    /// `sink` in chunks of about 64 KiB, memory flat; stops early when `sink` returns false.
    /// Returns the rows in chunks handed to `sink`.
    pub fn export_csv(
        &self,
        q: &Query,
        sink: &mut dyn FnMut(bytes::Bytes) -> bool,
    ) -> Result<u64, StoreError> {
        self.engine.export_csv(q, sink)
    }

    /// Blocking. The rollup rows of a range (see `rollup`): exact for any `start`/`end`.
    pub fn rollup(&self, q: &rollup::RollupQuery) -> Result<rollup::Rollup, StoreError> {
        self.engine.rollup(q)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_shareable_across_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Store>();
        shareable::<Arc<Store>>();
    }

    #[test]
    fn many_threads_record_at_once_and_queries_work_after_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        let opts = StoreOptions {
            channel_capacity: 64,
            ..StoreOptions::default()
        };
        let store = Store::open(&path, opts).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    for i in 0..10_000 {
                        store.record(sqlite::sample_record(t * 10_000 + i, "k", i as i64));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(store.flush(Duration::from_secs(30)));
        assert_eq!(store.stats().written, 40_000);
        store.close();
        let q = Query {
            key_id: Some("k".into()),
            start_ms: 0,
            end_ms: i64::MAX,
            limit: 1,
            ..Query::default()
        };
        let rows = store.export_csv(&q, &mut |_| true).unwrap();
        assert_eq!(rows, 40_000);
        assert_eq!(store.spend_totals().unwrap().len(), 1);
    }
}
