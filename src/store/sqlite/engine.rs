//! Store stage, the SQLite engine: the writer thread's connection, pooled read-only readers
//! (WAL lets them read while the writer commits) and the CSV export read in slices side by
//! side. The statements themselves are in `sqlite`, `query` and `rollup`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender};

use bytes::Bytes;
use rusqlite::Connection;

use super::console::SqliteConsole;
use super::read as query;
use super::rollup;
use crate::store::console::{AuditEntry, Session};
use crate::store::engine::{BatchWriter, Engine, WriteError};
use crate::store::query::{CsvOut, Page, Query};
use crate::store::record::UsageRecord;
use crate::store::rollup::{Rollup, RollupQuery};
use crate::store::{StoreError, sqlite};

/// Idle read-only connections kept for reuse (with their cached statements).
const READER_POOL: usize = 4;

/// Threads reading one CSV export side by side (the cores, at most 4).
fn export_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Chunks (64 KiB each) a slice read ahead of the one being sent may hold: a whole slice of
/// `query::SLICE_ROWS` rows at up to 256 bytes each; a denser slice than the rollups said
/// waits for the sender (memory stays bounded at about (workers + 2) × 1 MiB).
const SLICE_CHUNKS: usize = 16;

/// Which file a path names now (device and inode), or None when it names none.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

pub(in crate::store) struct SqliteWriter {
    conn: Connection,
    path: PathBuf,
    /// The file the connection opened.
    id: Option<(u64, u64)>,
}

impl SqliteWriter {
    /// Before each batch: a database file deleted or replaced under the running gateway would
    /// take the rows into a file no one can open again, lost at exit (and counted written). The
    /// batch waits in the spool instead, and the log says a restart opens the file at the path
    /// (the spool is written there then). Not opened anew here: a connection to the old file
    /// still open elsewhere (a reader, the console) deletes `-wal` and `-shm` by name when it
    /// closes last, which would be the new file's.
    fn check_the_file(&self) -> Result<(), WriteError> {
        if file_id(&self.path) == self.id {
            return Ok(());
        }
        Err(WriteError {
            msg: format!(
                "usage store: the database file {} was deleted or replaced while in use; records \
                 wait in the spool until a restart opens the file at that path",
                self.path.display()
            ),
            transient: true,
        })
    }
}

impl BatchWriter for SqliteWriter {
    fn insert_batch(&mut self, batch: &[UsageRecord]) -> Result<(), WriteError> {
        self.check_the_file()?;
        sqlite::insert_batch(&mut self.conn, batch)
    }

    /// Skips the records already in the table (looked up by key, time and request id: a seek
    /// in the primary key, made only for replays).
    fn insert_replayed(&mut self, batch: &[UsageRecord]) -> Result<(), WriteError> {
        self.check_the_file()?;
        let fresh = sqlite::not_stored(&self.conn, batch)?;
        if fresh.len() == batch.len() {
            return sqlite::insert_batch(&mut self.conn, batch);
        }
        tracing::info!(
            skipped = batch.len() - fresh.len(),
            "usage store: spooled records already written were skipped"
        );
        sqlite::insert_batch(&mut self.conn, &fresh)
    }

    fn not_stored(&mut self, batch: &[UsageRecord]) -> Vec<UsageRecord> {
        sqlite::not_stored(&self.conn, batch).unwrap_or_else(|_| batch.to_vec())
    }

    fn delete_expired(&mut self, cutoff_ms: i64) -> Result<bool, WriteError> {
        Ok(sqlite::delete_expired(&self.conn, cutoff_ms).map(|n| n >= sqlite::RETENTION_CHUNK)?)
    }

    fn durable(&mut self) -> Result<(), WriteError> {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        match std::fs::File::open(&wal).and_then(|f| f.sync_data()) {
            // No log: everything is in the database file, synced by its checkpoint.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(WriteError::from(format!(
                "usage store: syncing {}: {e}",
                std::path::Path::new(&wal).display()
            ))),
            Ok(()) => Ok(()),
        }
    }

    /// Frees the writer connection's page cache (up to its 16 MiB), which a burst fills and
    /// SQLite otherwise keeps for the connection's life.
    fn release_memory(&mut self) {
        if let Err(e) = self.conn.execute_batch("PRAGMA shrink_memory") {
            tracing::debug!("usage store: shrink_memory: {e}");
        }
    }
}

pub(in crate::store) struct SqliteEngine {
    path: PathBuf,
    readers: Mutex<Vec<Connection>>,
    closed: AtomicBool,
    console: SqliteConsole,
}

impl SqliteEngine {
    /// Creates parent folders, opens/creates the DB (WAL, synchronous=NORMAL, busy_timeout
    /// 5 s) and its schema; returns the engine and the writer thread's connection.
    pub fn open(path: &Path) -> Result<(SqliteEngine, SqliteWriter), String> {
        let conn = sqlite::open_writer(path)?;
        let console = SqliteConsole::open(path)?;
        let engine = SqliteEngine {
            path: path.to_path_buf(),
            readers: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            console,
        };
        let writer = SqliteWriter {
            conn,
            path: path.to_path_buf(),
            id: file_id(path),
        };
        Ok((engine, writer))
    }

    /// Runs `f` on a pooled read-only connection (opened on demand); a connection that saw an
    /// error is not pooled again.
    fn with_reader<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = self.readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match pooled {
            Some(c) => c,
            None => sqlite::open_reader(&self.path).map_err(StoreError)?,
        };
        let out = f(&conn);
        if out.is_ok() && !self.closed.load(Ordering::SeqCst) {
            let mut pool = self.readers.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < READER_POOL {
                pool.push(conn);
            }
        }
        out
    }
}

impl Engine for SqliteEngine {
    fn page(&self, q: &Query) -> Result<Page, StoreError> {
        self.with_reader(|conn| query::page(conn, q))
    }

    /// A range with enough rows is cut into time slices that `export_workers` threads read
    /// side by side (each its own connection), handed to `sink` in order as they come; each
    /// slice buffers at most `SLICE_CHUNKS` chunks ahead, so memory stays flat.
    fn export_csv(
        &self,
        q: &Query,
        sink: &mut dyn FnMut(Bytes) -> bool,
    ) -> Result<u64, StoreError> {
        let workers = export_workers();
        let slices = if workers > 1 {
            self.with_reader(|conn| query::slices(conn, q))?
        } else {
            Vec::new()
        };
        if slices.len() < 2 {
            return self.with_reader(|conn| query::export(conn, q, sink));
        }
        type Chunk = Result<(Bytes, u64), StoreError>;
        struct Job {
            slice: Query,
            tx: SyncSender<Chunk>,
        }
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let jobs_rx = Mutex::new(jobs_rx);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    loop {
                        let job = jobs_rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        // The sender is gone: the export is over.
                        let Ok(job) = job else { return };
                        let done = self.with_reader(|conn| {
                            query::export_rows(conn, &job.slice, &mut |chunk, rows| {
                                job.tx.send(Ok((chunk, rows))).is_ok()
                            })
                        });
                        if let Err(e) = done {
                            let _ = job.tx.send(Err(e));
                        }
                    }
                });
            }
            // Slices handed out ahead of the one being sent: every worker busy, no more.
            let mut slices = slices.into_iter();
            let mut ahead = std::collections::VecDeque::with_capacity(workers + 1);
            let mut hand_out = |ahead: &mut std::collections::VecDeque<_>| {
                if let Some(slice) = slices.next() {
                    let (tx, rx) = mpsc::sync_channel::<Chunk>(SLICE_CHUNKS);
                    if jobs_tx.send(Job { slice, tx }).is_ok() {
                        ahead.push_back(rx);
                    }
                }
            };
            for _ in 0..=workers {
                hand_out(&mut ahead);
            }
            let mut out = CsvOut::new(sink);
            let result = (|| {
                while let Some(rx) = ahead.pop_front() {
                    hand_out(&mut ahead);
                    // A slice's channel closes when its worker is done with it.
                    for chunk in rx {
                        let (chunk, rows) = chunk?;
                        if !out.put(chunk, rows) {
                            return Ok(false);
                        }
                    }
                }
                Ok(true)
            })();
            // Workers see their slice's receiver gone, or no more jobs, and stop.
            drop(ahead);
            drop(jobs_tx);
            match result {
                Ok(true) => Ok(out.finish()),
                Ok(false) => Ok(out.sent),
                Err(e) => Err(e),
            }
        })
    }

    fn rollup(&self, q: &RollupQuery) -> Result<Rollup, StoreError> {
        self.with_reader(|conn| rollup::read(conn, q))
    }

    fn spend_totals(&self) -> Result<HashMap<String, f64>, StoreError> {
        self.with_reader(|c| sqlite::spend_totals(c).map_err(StoreError))
    }

    fn last_used(&self) -> Result<HashMap<String, i64>, StoreError> {
        self.with_reader(|c| sqlite::last_used(c).map_err(StoreError))
    }

    fn session_put(&self, token_sha256: &str, s: &Session) -> Result<(), StoreError> {
        self.console.session_put(token_sha256, s)
    }

    fn session_get(&self, token_sha256: &str, now_ms: i64) -> Result<Option<Session>, StoreError> {
        self.console.session_get(token_sha256, now_ms)
    }

    fn session_delete(&self, token_sha256: &str) -> Result<(), StoreError> {
        self.console.session_delete(token_sha256)
    }

    fn audit_add(&self, e: &AuditEntry) -> Result<(), StoreError> {
        self.console.audit_add(e)
    }

    fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        self.console.audit_list(limit)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}
