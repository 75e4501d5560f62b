//! Store stage, SQLite side: the schema, the connections (one writer, pooled read-only
//! readers) and the statements the writer thread runs per batch: inserts, the spend upsert and
//! retention deletes.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::store::record::UsageRecord;

/// Narrow columns, one per `UsageRecord` field, so the console and exports never parse blobs.
/// The table is clustered by key: its primary key is (key_id, time_ms, seq), so one key's rows
/// lie together in time order and a key's page or export is one sequential walk. `seq` is
/// unique and grows with each insert (`usage_seq` holds the next one); it is the tie-breaker of
/// the (time_ms, seq) keyset order. `usage_time` serves the queries across every key.
mod console;
mod engine;
mod read;
mod rollup;
mod rows;

pub(super) use engine::SqliteEngine;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS usage (
    key_id TEXT NOT NULL,
    time_ms INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    listener TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT NOT NULL,
    status INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    total_tokens INTEGER NOT NULL,
    cost REAL NOT NULL,
    latency_ms INTEGER NOT NULL,
    ttft_ms INTEGER,
    upstream TEXT NOT NULL,
    estimated INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 1,
    served_model TEXT NOT NULL DEFAULT '',
    cut TEXT NOT NULL DEFAULT '',
    cached_prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, time_ms, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS usage_time ON usage (time_ms, seq);
CREATE TABLE IF NOT EXISTS usage_seq (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    next INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS spend (
    key_id TEXT PRIMARY KEY NOT NULL,
    spend REAL NOT NULL
) WITHOUT ROWID;
";

/// The first layout (a rowid table in arrival order, a `(key_id, time_ms)` index) made one
/// key's export seek once per row across the whole table. Its rows move to the clustered
/// table once, keeping their rowid as `seq`, so cursors handed out before stay valid.
const MIGRATE_ROWID_TABLE: &str = "
DROP INDEX IF EXISTS usage_key_time;
DROP INDEX IF EXISTS usage_time;
ALTER TABLE usage RENAME TO usage_rowid;
";
const MIGRATE_COPY: &str = "
INSERT INTO usage (key_id, time_ms, seq, request_id, listener, endpoint, model, status, stream,
    prompt_tokens, completion_tokens, total_tokens, cost, latency_ms, ttft_ms, upstream,
    estimated)
SELECT key_id, time_ms, rowid, request_id, listener, endpoint, model, status, stream,
    prompt_tokens, completion_tokens, total_tokens, cost, latency_ms, ttft_ms, upstream,
    estimated FROM usage_rowid ORDER BY key_id, time_ms, rowid;
DROP TABLE usage_rowid;
";

const INSERT: &str = "INSERT INTO usage (time_ms, request_id, key_id, listener, endpoint, model, \
     status, stream, prompt_tokens, completion_tokens, total_tokens, cost, latency_ms, ttft_ms, \
     upstream, estimated, seq, attempts, served_model, cut, cached_prompt_tokens, \
     cache_write_tokens, reasoning_tokens) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, \
     ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)";

const SPEND_UPSERT: &str = "INSERT INTO spend (key_id, spend, last_used_ms) VALUES (?1, ?2, ?3) \
     ON CONFLICT(key_id) DO UPDATE SET spend = spend + excluded.spend, \
     last_used_ms = MAX(last_used_ms, excluded.last_used_ms)";

/// A batch gives its core away (`sched_yield`) every this many rows: a request arriving while a
/// large batch is written waits for a few dozen µs of it (16 rows), not the whole batch.
const YIELD_EVERY: i64 = 16;

/// The writer's page cache, in KiB (SQLite's negative form).
const WRITER_CACHE_KIB: i64 = -16_384;

/// Small enough that one DELETE never holds the write lock long enough to stall a batch.
pub(in crate::store) const RETENTION_CHUNK: usize = 5_000;

const RETENTION_DELETE: &str = "DELETE FROM usage WHERE (key_id, time_ms, seq) IN \
     (SELECT key_id, time_ms, seq FROM usage WHERE time_ms < ?1 ORDER BY time_ms LIMIT ?2)";

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

fn db_err(what: &str, e: rusqlite::Error) -> String {
    format!("usage store: {what}: {e}")
}

/// A failed write of a batch. Transient when waiting can mend it: the lock held by another
/// connection, a full disk, a read-only or failing file system, a file that cannot be opened.
/// The batch then waits in the spool (on its own file system, it has room where the database
/// has none) and is tried again, rather than being counted lost.
pub(in crate::store) fn write_err(
    what: &str,
    e: rusqlite::Error,
) -> crate::store::engine::WriteError {
    use rusqlite::ErrorCode::*;
    let transient = matches!(
        e.sqlite_error_code(),
        Some(DatabaseBusy | DatabaseLocked | DiskFull | SystemIoFailure | ReadOnly | CannotOpen)
    );
    crate::store::engine::WriteError {
        msg: db_err(what, e),
        transient,
    }
}

/// Opens (creating if needed) the database the writer thread owns, in WAL mode so readers
/// never wait on it; `synchronous=NORMAL` is durable across process crashes in WAL mode and only
/// risks the last commits on power loss, the usual trade for a usage log.
pub(in crate::store) fn open_writer(path: &Path) -> Result<Connection, String> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("usage store: creating {}: {e}", dir.display()))?;
        }
    }
    let conn =
        Connection::open(path).map_err(|e| db_err(&format!("opening {}", path.display()), e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| db_err("busy_timeout", e))?;
    // 16 KiB pages (a new database only; an existing one keeps its size): one key's export
    // walks rows spread across the table, and bigger pages mean a quarter of the page loads.
    // Measured on 10M records: one key's 1M-row export 255k → 356k rows/s, all keys' 587k →
    // 605k, fill 155k → 190k records/s. Not larger: scattered index and rollup updates write
    // whole pages to the WAL.
    conn.pragma_update(None, "page_size", 16_384)
        .map_err(|e| db_err("page_size", e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| db_err("journal_mode", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!(
            "usage store: {} refused WAL mode (got {mode})",
            path.display()
        ));
    }
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(|e| db_err("synchronous", e))?;
    // The writer's page cache: big enough for the pages a stream of batches keeps touching
    // (each key's tail in the clustered table, the time index's tail, the rollups). With the
    // default 2 MiB a third of the writer's time was the kernel copying pages it had just
    // written back in.
    conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)
        .map_err(|e| db_err("cache_size", e))?;
    let mut conn = conn;
    migrate_rowid_table(&mut conn)?;
    conn.execute_batch(SCHEMA)
        .map_err(|e| db_err("creating schema", e))?;
    // `spend.last_used_ms`: when each key last made a request.
    add_column(
        &conn,
        "spend",
        "last_used_ms",
        "ALTER TABLE spend ADD COLUMN last_used_ms INTEGER NOT NULL DEFAULT 0",
    )?;
    // Retries and fallbacks: older rows read as one try, by the model they name.
    add_column(
        &conn,
        "usage",
        "attempts",
        "ALTER TABLE usage ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1; \
         ALTER TABLE usage ADD COLUMN served_model TEXT NOT NULL DEFAULT '';",
    )?;
    // Why a reply was cut short: older rows read as not cut.
    add_column(
        &conn,
        "usage",
        "cut",
        "ALTER TABLE usage ADD COLUMN cut TEXT NOT NULL DEFAULT '';",
    )?;
    // The prompt's cached and cache-write tokens, the output's reasoning: older rows have none.
    add_column(
        &conn,
        "usage",
        "cached_prompt_tokens",
        "ALTER TABLE usage ADD COLUMN cached_prompt_tokens INTEGER NOT NULL DEFAULT 0; \
         ALTER TABLE usage ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0; \
         ALTER TABLE usage ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0;",
    )?;
    conn.execute_batch(rollup::SCHEMA)
        .map_err(|e| db_err("creating the rollup schema", e))?;
    rollup::backfill(&mut conn)?;
    Ok(conn)
}

/// Moves a first-layout `usage` table (no `seq` column) into the clustered one, in one
/// transaction: a crash midway leaves the old table as it was.
fn migrate_rowid_table(conn: &mut Connection) -> Result<(), String> {
    let old: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'usage') \
             AND NOT EXISTS (SELECT 1 FROM pragma_table_info('usage') WHERE name = 'seq')",
            [],
            |r| r.get(0),
        )
        .map_err(|e| db_err("reading the usage table", e))?;
    if !old {
        return Ok(());
    }
    tracing::info!("usage store: clustering the records by key (once; a minute per 10M records)");
    let tx = conn.transaction().map_err(|e| db_err("begin", e))?;
    tx.execute_batch(MIGRATE_ROWID_TABLE)
        .and_then(|()| tx.execute_batch(SCHEMA))
        .and_then(|()| tx.execute_batch(MIGRATE_COPY))
        .map_err(|e| db_err("clustering the records by key", e))?;
    tx.commit().map_err(|e| db_err("commit", e))
}

/// The `seq` the next insert takes: kept in `usage_seq`, or one past the largest in the table
/// (once, for a table that has none yet).
fn next_seq(tx: &Connection) -> Result<i64, crate::store::engine::WriteError> {
    let kept: Option<i64> = tx
        .query_row("SELECT next FROM usage_seq WHERE id = 0", [], |r| r.get(0))
        .optional()
        .map_err(|e| write_err("reading usage_seq", e))?;
    match kept {
        Some(n) => Ok(n),
        None => tx
            .query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM usage", [], |r| {
                r.get(0)
            })
            .map_err(|e| write_err("reading the largest seq", e)),
    }
}

/// Adds `column` to `table` with `ddl` (its `ALTER TABLE` statements) unless it is there:
/// columns that came after the first release, which older files lack.
fn add_column(conn: &Connection, table: &str, column: &str, ddl: &str) -> Result<(), String> {
    let has: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
            params![table, column],
            |r| r.get(0),
        )
        .map_err(|e| db_err(&format!("reading the {table} table"), e))?;
    if !has {
        conn.execute_batch(ddl)
            .map_err(|e| db_err(&format!("adding {table}.{column}"), e))?;
    }
    Ok(())
}

/// A read-only connection for queries and exports; WAL lets it read while the writer commits.
pub(in crate::store) fn open_reader(path: &Path) -> Result<Connection, String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| db_err(&format!("opening {} to read", path.display()), e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| db_err("busy_timeout", e))?;
    Ok(conn)
}

/// SQLite integers are signed; counters beyond i64 cannot happen in practice, so saturate.
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The records of `batch` not in the table yet (for a replay of the spool).
pub(in crate::store) fn not_stored(
    conn: &Connection,
    batch: &[UsageRecord],
) -> Result<Vec<UsageRecord>, crate::store::engine::WriteError> {
    let mut find = conn
        .prepare_cached(
            "SELECT 1 FROM usage WHERE key_id = ?1 AND time_ms = ?2 AND request_id = ?3 LIMIT 1",
        )
        .map_err(|e| write_err("prepare lookup", e))?;
    let mut fresh = Vec::with_capacity(batch.len());
    for r in batch {
        let stored = find
            .exists(params![r.key_id, r.time_ms, r.request_id])
            .map_err(|e| write_err("lookup", e))?;
        if !stored {
            fresh.push(r.clone());
        }
    }
    Ok(fresh)
}

/// Inserts one batch, adds its cost per key to `spend` and its sums to the rollups, in a single
/// transaction, so neither ever disagrees with the rows that were committed.
///
/// The transaction is IMMEDIATE: it takes the write lock at BEGIN, where a lock held by another
/// connection (the console's) is waited for under `busy_timeout`. A deferred one would read
/// `usage_seq` first and then find its snapshot stale when another connection had committed
/// meanwhile: SQLite then fails the write at once (SQLITE_BUSY_SNAPSHOT, no busy wait), and a
/// sign-in racing a batch cost that batch.
///
/// The lock still held by another connection after `busy_timeout` (a backup, or someone's
/// `sqlite3` shell in a write transaction) is a transient failure: the writer keeps the batch
/// in the spool and tries again, so nothing is lost to it.
pub(in crate::store) fn insert_batch(
    conn: &mut Connection,
    batch: &[UsageRecord],
) -> Result<(), crate::store::engine::WriteError> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| write_err("begin", e))?;
    let mut spend: foldhash::HashMap<&str, (f64, i64)> = Default::default();
    let mut seq = next_seq(&tx)?;
    {
        let mut insert = tx
            .prepare_cached(INSERT)
            .map_err(|e| write_err("prepare insert", e))?;
        for r in batch {
            insert
                .execute(params![
                    r.time_ms,
                    r.request_id,
                    r.key_id,
                    r.listener,
                    r.endpoint,
                    r.model,
                    i64::from(r.status),
                    r.stream,
                    int(r.prompt_tokens),
                    int(r.completion_tokens),
                    int(r.total_tokens),
                    r.cost,
                    int(r.latency_ms),
                    r.ttft_ms.map(int),
                    r.upstream,
                    r.estimated,
                    seq,
                    r.attempts,
                    r.served_model,
                    r.cut,
                    int(r.cached_prompt_tokens),
                    int(r.cache_write_tokens),
                    int(r.reasoning_tokens),
                ])
                .map_err(|e| write_err("insert", e))?;
            seq += 1;
            if seq % YIELD_EVERY == 0 {
                // Requests sharing this core wait at most this many rows for it.
                std::thread::yield_now();
            }
            let s = spend.entry(r.key_id.as_str()).or_insert((0.0, i64::MIN));
            s.0 += r.cost;
            s.1 = s.1.max(r.time_ms);
        }
        let mut upsert = tx
            .prepare_cached(SPEND_UPSERT)
            .map_err(|e| write_err("prepare spend", e))?;
        for (key, (cost, last)) in spend {
            upsert
                .execute(params![key, cost, last])
                .map_err(|e| write_err("spend", e))?;
        }
    }
    tx.prepare_cached("INSERT OR REPLACE INTO usage_seq (id, next) VALUES (0, ?1)")
        .and_then(|mut s| s.execute(params![seq]))
        .map_err(|e| write_err("usage_seq", e))?;
    rollup::add_batch(&tx, batch)?;
    tx.commit().map_err(|e| write_err("commit", e))
}

/// Deletes at most one chunk of rows older than `cutoff_ms`; returns how many went. The
/// spend table is untouched, so retention never lowers a key's spend.
pub(in crate::store) fn delete_expired(conn: &Connection, cutoff_ms: i64) -> Result<usize, String> {
    let mut stmt = conn
        .prepare_cached(RETENTION_DELETE)
        .map_err(|e| db_err("prepare retention", e))?;
    let n = stmt
        .execute(params![cutoff_ms, RETENTION_CHUNK as i64])
        .map_err(|e| db_err("retention", e))?;
    // Rollups of quarters wholly before the cutoff go with their rows, so summaries never
    // count records the usage API no longer has.
    conn.prepare_cached("DELETE FROM usage_rollup WHERE bucket_ms < ?1")
        .and_then(|mut s| s.execute(params![crate::store::rollup::bucket_of(cutoff_ms)]))
        .map_err(|e| db_err("rollup retention", e))?;
    Ok(n)
}

/// key_id → unix ms of its last request (as committed).
pub(in crate::store) fn last_used(conn: &Connection) -> Result<HashMap<String, i64>, String> {
    let mut stmt = conn
        .prepare_cached("SELECT key_id, last_used_ms FROM spend")
        .map_err(|e| db_err("prepare last used", e))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(|e| db_err("last used", e))?;
    rows.collect::<Result<HashMap<_, _>, _>>()
        .map_err(|e| db_err("last used", e))
}

pub(in crate::store) fn spend_totals(conn: &Connection) -> Result<HashMap<String, f64>, String> {
    let mut stmt = conn
        .prepare_cached("SELECT key_id, spend FROM spend")
        .map_err(|e| db_err("prepare spend totals", e))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?)))
        .map_err(|e| db_err("spend totals", e))?;
    let mut out = HashMap::new();
    for row in rows {
        let (key, spend) = row.map_err(|e| db_err("spend totals", e))?;
        out.insert(key, spend);
    }
    Ok(out)
}

/// A record whose fields all differ by `i`, for the store's tests.
#[cfg(test)]
pub(in crate::store) fn sample_record(i: u64, key: &str, time_ms: i64) -> UsageRecord {
    UsageRecord {
        time_ms,
        request_id: format!("req_{i}"),
        key_id: key.to_string(),
        listener: if i % 2 == 0 { "main" } else { "direct" }.into(),
        endpoint: "chat".into(),
        model: format!("model,\"{}\"", i % 7),
        status: 200 + (i % 300) as u16,
        stream: i % 3 == 0,
        prompt_tokens: i,
        completion_tokens: i * 2,
        total_tokens: i * 3,
        cost: (i % 8) as f64 * 0.125,
        latency_ms: i + 5,
        ttft_ms: if i % 2 == 0 { None } else { Some(i) },
        upstream: "http://127.0.0.1:9100".into(),
        estimated: i % 5 == 0,
        attempts: (i % 3) as u32 + 1,
        served_model: if i % 4 == 0 {
            String::new()
        } else {
            format!("served-{}", i % 3)
        },
        cut: if i % 6 == 1 { "client" } else { "" }.into(),
        cached_prompt_tokens: i / 2,
        cache_write_tokens: i % 3,
        reasoning_tokens: i % 4,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{Query, Store, StoreOptions};

    #[test]
    fn records_read_back_equal_with_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/dir/usage.db");
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        let mut sent: Vec<UsageRecord> = (0..50)
            .map(|i| sample_record(i, "k", 1_000 + i as i64))
            .collect();
        sent[3].ttft_ms = None;
        sent[4].ttft_ms = Some(0);
        sent[5].prompt_tokens = u64::MAX; // saturates to i64::MAX on the way in
        for r in &sent {
            store.record(r.clone());
        }
        assert!(store.flush(Duration::from_secs(10)));
        sent[5].prompt_tokens = i64::MAX as u64;
        let page = store
            .query(&Query {
                key_id: None,
                start_ms: 0,
                end_ms: i64::MAX,
                limit: 100,
                ..Query::default()
            })
            .unwrap();
        assert_eq!(page.records, sent);
        assert_eq!(page.next_cursor, None);
        assert_eq!(store.stats().written, 50);
    }

    /// Another connection in a write transaction (a write made, not committed): the file's
    /// write lock is held until it sends `COMMIT`.
    fn hold_write_lock(path: &Path) -> Connection {
        let other = Connection::open(path).unwrap();
        other
            .execute_batch(
                "BEGIN IMMEDIATE; CREATE TABLE side (x INTEGER); INSERT INTO side VALUES (1);",
            )
            .unwrap();
        other
    }

    /// Another connection commits between the batch's start and its first write: the batch
    /// waits for the lock and commits rather than failing on a stale snapshot.
    #[test]
    fn a_batch_waits_for_a_write_by_another_connection_and_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        let mut conn = open_writer(&path).unwrap();
        insert_batch(&mut conn, &[sample_record(1, "k", 1_000)]).unwrap();
        let other = hold_write_lock(&path);
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            locked_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            other.execute_batch("COMMIT").unwrap();
        });
        locked_rx.recv().unwrap();
        insert_batch(&mut conn, &[sample_record(2, "k", 2_000)]).unwrap();
        holder.join().unwrap();
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM usage", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
    }

    /// Another process keeps the file locked past the busy timeout (5 s): the batch waits in
    /// the spool, and once the lock goes every record is written, none lost.
    #[test]
    fn a_file_locked_past_the_busy_timeout_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        let opts = StoreOptions {
            spool: Some(dir.path().join("spool.jsonl")),
            ..StoreOptions::default()
        };
        let store = Store::open(&path, opts).unwrap();
        store.record(sample_record(0, "k", 1_000));
        assert!(store.flush(Duration::from_secs(10)));
        let other = hold_write_lock(&path);
        for i in 1..=100 {
            store.record(sample_record(i, "k", 1_000 + i as i64));
        }
        let start = std::time::Instant::now();
        while store.stats().spool_bytes == 0 {
            assert!(start.elapsed() < Duration::from_secs(30), "never spooled");
            std::thread::sleep(Duration::from_millis(50));
        }
        other.execute_batch("COMMIT").unwrap();
        assert!(store.flush(Duration::from_secs(30)));
        let stats = store.stats();
        assert_eq!(
            (stats.written, stats.write_errors, stats.spool_bytes),
            (101, 0, 0)
        );
    }

    /// A crash between a replayed batch's commit and the spool's note of it: the next start
    /// replays those records again, and they are skipped, neither rows nor spend counted twice.
    #[test]
    fn records_replayed_twice_from_the_spool_are_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        let spool_path = dir.path().join("spool.jsonl");
        let recs: Vec<UsageRecord> = (0..10)
            .map(|i| sample_record(i, "k", 1_000 + i as i64))
            .collect();
        {
            let store = Store::open(&path, StoreOptions::default()).unwrap();
            for r in &recs[..6] {
                store.record(r.clone());
            }
            store.close();
        }
        crate::store::spool::Spool::new(spool_path.clone())
            .append(&recs)
            .unwrap();
        let opts = StoreOptions {
            spool: Some(spool_path.clone()),
            ..StoreOptions::default()
        };
        let store = Store::open(&path, opts).unwrap();
        let spent = store.spend_at_open()["k"];
        assert!(store.flush(Duration::from_secs(10)));
        assert!(!spool_path.exists());
        store.close();
        let conn = Connection::open(&path).unwrap();
        let n: i64 = conn
            .query_row(
                "SELECT COUNT(DISTINCT request_id) = COUNT(*), COUNT(*) FROM usage",
                [],
                |r| {
                    assert!(r.get::<_, bool>(0)?, "a record written twice");
                    r.get(1)
                },
            )
            .unwrap();
        assert_eq!(n, 10);
        let spend: f64 = conn
            .query_row("SELECT spend FROM spend WHERE key_id = 'k'", [], |r| {
                r.get(0)
            })
            .unwrap();
        let want: f64 = recs.iter().map(|r| r.cost).sum();
        assert!((spend - want).abs() < 1e-9, "{spend} vs {want}");
        // The spend at open counted only the records not in yet: no cost twice.
        assert!((spent - want).abs() < 1e-9, "{spent} vs {want}");
    }

    #[test]
    fn a_full_database_is_a_transient_failure_and_the_batch_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open_writer(&dir.path().join("u.db")).unwrap();
        // No page more than it has: the next batch finds the "disk" full.
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        conn.pragma_update(None, "max_page_count", pages).unwrap();
        let batch: Vec<UsageRecord> = (0..2_000)
            .map(|i| sample_record(i, "k", 1_000 + i as i64))
            .collect();
        let e = insert_batch(&mut conn, &batch).unwrap_err();
        assert!(e.transient, "{}", e.msg);
        assert!(e.msg.contains("full"), "{}", e.msg);
        // Room again: the same batch commits whole.
        conn.pragma_update(None, "max_page_count", 1_000_000_000)
            .unwrap();
        insert_batch(&mut conn, &batch).unwrap();
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM usage", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2_000);
    }

    /// The database file deleted under the running store: batches wait in the spool (not in
    /// the deleted file) and are written to the file a restart opens at the path.
    #[test]
    fn records_for_a_deleted_database_file_wait_in_the_spool_for_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        let opts = || StoreOptions {
            spool: Some(dir.path().join("spool.jsonl")),
            ..StoreOptions::default()
        };
        let all = Query {
            key_id: None,
            start_ms: 0,
            end_ms: i64::MAX,
            limit: 100,
            ..Query::default()
        };
        let store = Store::open(&path, opts()).unwrap();
        store.record(sample_record(0, "k", 1_000));
        assert!(store.flush(Duration::from_secs(10)));
        for f in ["u.db", "u.db-wal", "u.db-shm"] {
            let _ = std::fs::remove_file(dir.path().join(f));
        }
        store.record(sample_record(1, "k", 2_000));
        store.record(sample_record(2, "k", 3_000));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.stats().spool_bytes == 0 {
            assert!(std::time::Instant::now() < deadline, "nothing spooled");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(store.stats().write_errors, 0);
        store.close();
        let again = Store::open(&path, opts()).unwrap();
        assert!(again.flush(Duration::from_secs(10)));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got: Vec<i64> = again
                .query(&all)
                .unwrap()
                .records
                .iter()
                .map(|r| r.time_ms)
                .collect();
            if got.len() == 2 {
                assert_eq!(got, [2_000, 3_000]);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{got:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_database_is_in_wal_mode_with_normal_sync() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join("u.db")).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 1, "NORMAL");
        let page: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        assert_eq!(page, 16_384);
    }

    #[test]
    fn a_first_layout_table_is_clustered_once_and_keeps_rows_cursors_and_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        {
            // The first release's table: rowid order is arrival order, keys interleaved.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE usage (time_ms INTEGER NOT NULL, request_id TEXT NOT NULL, \
                 key_id TEXT NOT NULL, listener TEXT NOT NULL, endpoint TEXT NOT NULL, \
                 model TEXT NOT NULL, status INTEGER NOT NULL, stream INTEGER NOT NULL, \
                 prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, \
                 total_tokens INTEGER NOT NULL, cost REAL NOT NULL, latency_ms INTEGER NOT NULL, \
                 ttft_ms INTEGER, upstream TEXT NOT NULL, estimated INTEGER NOT NULL);
                 CREATE INDEX usage_key_time ON usage (key_id, time_ms);
                 CREATE INDEX usage_time ON usage (time_ms);
                 CREATE TABLE spend (key_id TEXT PRIMARY KEY NOT NULL, spend REAL NOT NULL) \
                 WITHOUT ROWID;",
            )
            .unwrap();
            for i in 0..30u64 {
                let r = sample_record(i, ["a", "b", "c"][i as usize % 3], 1_000 + (i / 2) as i64);
                conn.execute(
                    "INSERT INTO usage (time_ms, request_id, key_id, listener, endpoint, model, \
                     status, stream, prompt_tokens, completion_tokens, total_tokens, cost, \
                     latency_ms, ttft_ms, upstream, estimated) VALUES (?1, ?2, ?3, ?4, ?5, ?6, \
                     ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
                    params![
                        r.time_ms,
                        r.request_id,
                        r.key_id,
                        r.listener,
                        r.endpoint,
                        r.model,
                        i64::from(r.status),
                        r.stream,
                        int(r.prompt_tokens),
                        int(r.completion_tokens),
                        int(r.total_tokens),
                        r.cost,
                        int(r.latency_ms),
                        r.ttft_ms.map(int),
                        r.upstream,
                        r.estimated
                    ],
                )
                .unwrap();
            }
        }
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        let q = |key: Option<&str>, cursor| Query {
            key_id: key.map(String::from),
            start_ms: 0,
            end_ms: i64::MAX,
            limit: 4,
            cursor,
            ..Query::default()
        };
        // A cursor handed out before the move (rowid 8 = the 8th row) still means the same row.
        let old_cursor = crate::store::Cursor {
            time_ms: 1_003,
            seq: 8,
        };
        let after = store.query(&q(None, Some(old_cursor))).unwrap();
        assert_eq!(after.records[0].request_id, "req_8");
        let a = store
            .query(&Query {
                limit: 100,
                ..q(Some("a"), None)
            })
            .unwrap();
        let ids: Vec<_> = a.records.iter().map(|r| r.request_id.clone()).collect();
        let want: Vec<_> = (0..30).step_by(3).map(|i| format!("req_{i}")).collect();
        assert_eq!(ids, want);
        // New rows continue after the moved ones.
        store.record(sample_record(99, "a", 1_014));
        assert!(store.flush(Duration::from_secs(10)));
        let all = store
            .query(&Query {
                limit: 100,
                ..q(None, None)
            })
            .unwrap();
        assert_eq!(all.records.len(), 31);
        assert_eq!(all.records.last().unwrap().request_id, "req_99");
        drop(store);
        let conn = Connection::open(&path).unwrap();
        let (layout, max_seq): (i64, i64) = conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM sqlite_schema WHERE name IN ('usage_rowid', \
                 'usage_key_time')), (SELECT MAX(seq) FROM usage)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((layout, max_seq), (0, 31));
    }
}
