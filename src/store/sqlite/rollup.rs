//! Store stage, the SQLite engine's rollups: the table, the writer's upsert of each batch (in
//! the batch's own transaction), the backfill of an older database, and the read of a range
//! (`rollup::Plan`: stored rows for its whole buckets, raw rows for its edges).

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Transaction, params, params_from_iter};

use super::rows::{blank_record, read_row};
use crate::store::StoreError;
use crate::store::query::SELECT_COLUMNS;
use crate::store::record::UsageRecord;
use crate::store::rollup::{
    Plan, Rollup, RollupQuery, RollupRow, Sums, add_encoded, aggregate, encode, int, push_records,
    uint,
};

/// `latency` is the rows' latency histogram: (bin u8, count u32 LE) pairs, bins ascending. Kept
/// in the row, not a table of its own, so a 30-day summary reads one row per bucket × model ×
/// status instead of one per latency bin too.
pub(in crate::store) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS usage_rollup (
    key_id TEXT NOT NULL,
    bucket_ms INTEGER NOT NULL,
    model TEXT NOT NULL,
    status INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    total_tokens INTEGER NOT NULL,
    cost REAL NOT NULL,
    latency_ms INTEGER NOT NULL,
    estimated INTEGER NOT NULL,
    latency BLOB NOT NULL,
    PRIMARY KEY (key_id, bucket_ms, model, status)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS usage_rollup_time ON usage_rollup (bucket_ms);
";

const UPSERT_ROLLUP: &str = "INSERT INTO usage_rollup (key_id, bucket_ms, model, status, \
     requests, prompt_tokens, completion_tokens, total_tokens, cost, latency_ms, estimated, \
     latency) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
     ON CONFLICT(key_id, bucket_ms, model, status) DO UPDATE SET \
     requests = requests + excluded.requests, \
     prompt_tokens = prompt_tokens + excluded.prompt_tokens, \
     completion_tokens = completion_tokens + excluded.completion_tokens, \
     total_tokens = total_tokens + excluded.total_tokens, cost = cost + excluded.cost, \
     latency_ms = latency_ms + excluded.latency_ms, estimated = estimated + excluded.estimated, \
     latency = excluded.latency";

const SELECT_LATENCY: &str = "SELECT latency FROM usage_rollup \
     WHERE key_id = ?1 AND bucket_ms = ?2 AND model = ?3 AND status = ?4";

/// Adds a batch to the rollups, inside the writer's transaction. A row's histogram is merged
/// with the stored one here (the writer is the only one writing, so read-then-write holds).
pub(in crate::store) fn add_batch(
    tx: &Transaction<'_>,
    batch: &[UsageRecord],
) -> Result<(), crate::store::engine::WriteError> {
    let err = |what: &str, e: rusqlite::Error| super::write_err(&format!("rollup {what}"), e);
    let mut select = tx
        .prepare_cached(SELECT_LATENCY)
        .map_err(|e| err("prepare", e))?;
    let mut up = tx
        .prepare_cached(UPSERT_ROLLUP)
        .map_err(|e| err("prepare", e))?;
    for ((bucket, key, model, status), (s, mut hist)) in aggregate(batch) {
        let status = i64::from(status);
        let stored: Option<Vec<u8>> = select
            .query_row(params![key, bucket, model, status], |r| r.get(0))
            .optional()
            .map_err(|e| err("read", e))?;
        if let Some(bytes) = stored {
            add_encoded(&mut hist, &bytes);
        }
        up.execute(params![
            key,
            bucket,
            model,
            status,
            int(s.requests),
            int(s.prompt_tokens),
            int(s.completion_tokens),
            int(s.total_tokens),
            s.cost,
            int(s.latency_ms),
            int(s.estimated),
            encode(&hist),
        ])
        .map_err(|e| err("upsert", e))?;
    }
    Ok(())
}

/// Builds the rollups of a database written before they existed, once, at open.
pub(in crate::store) fn backfill(conn: &mut Connection) -> Result<(), String> {
    let err = |e: rusqlite::Error| format!("usage store: rollup backfill: {e}");
    let has_rollups: bool = conn
        .query_row("SELECT EXISTS (SELECT 1 FROM usage_rollup)", [], |r| {
            r.get(0)
        })
        .map_err(err)?;
    let has_rows: bool = conn
        .query_row("SELECT EXISTS (SELECT 1 FROM usage)", [], |r| r.get(0))
        .map_err(err)?;
    if has_rollups || !has_rows {
        return Ok(());
    }
    tracing::info!("usage store: building rollups from the existing records (once)");
    // IMMEDIATE: it reads before it writes (see `sqlite::insert_batch`).
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(err)?;
    {
        let mut stmt = tx
            .prepare(&format!("SELECT {SELECT_COLUMNS} FROM usage"))
            .map_err(err)?;
        let mut rows = stmt.query([]).map_err(err)?;
        let mut chunk = Vec::with_capacity(65_536);
        let mut rec = blank_record();
        while let Some(row) = rows.next().map_err(err)? {
            read_row(row, &mut rec).map_err(err)?;
            chunk.push(rec.clone());
            if chunk.len() == 65_536 {
                add_batch(&tx, &chunk).map_err(|e| e.msg)?;
                chunk.clear();
            }
        }
        add_batch(&tx, &chunk).map_err(|e| e.msg)?;
    }
    tx.commit().map_err(err)
}

/// Appends ` AND key_id = ?N` / ` AND model = ?N` for the filters the query has.
fn filters(q: &RollupQuery, sql: &mut String, args: &mut Vec<Value>) {
    for (col, v) in [("key_id", &q.key_id), ("model", &q.model)] {
        if let Some(v) = v {
            args.push(Value::Text(v.clone()));
            sql.push_str(&format!(" AND {col} = ?{}", args.len()));
        }
    }
}

/// The rollup of `[start, end)`: stored rollups for its whole buckets, raw rows summed the
/// same way for the partial buckets at its edges.
pub(in crate::store) fn read(conn: &Connection, q: &RollupQuery) -> Result<Rollup, StoreError> {
    let mut out = Rollup::default();
    let plan = Plan::of(q);
    if let Some((from, to)) = plan.whole {
        whole_buckets(conn, q, from, to, &mut out)?;
    }
    for (from, to) in plan.edges {
        raw_rows(conn, q, from, to, &mut out)?;
    }
    out.rows.sort_by_key(|r| r.bucket_ms);
    Ok(out)
}

/// Runs `sql` with `args` and hands each row to `f`.
fn each_row(
    conn: &Connection,
    sql: &str,
    args: &[Value],
    mut f: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<()>,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(StoreError::query)?;
    let mut rows = stmt
        .query(params_from_iter(args.iter()))
        .map_err(StoreError::query)?;
    while let Some(r) = rows.next().map_err(StoreError::query)? {
        f(r).map_err(StoreError::query)?;
    }
    Ok(())
}

fn whole_buckets(
    conn: &Connection,
    q: &RollupQuery,
    from: i64,
    to: i64,
    out: &mut Rollup,
) -> Result<(), StoreError> {
    let mut args = vec![Value::Integer(from), Value::Integer(to)];
    let mut sql = String::from(
        "SELECT bucket_ms, key_id, model, status, requests, prompt_tokens, completion_tokens, \
         total_tokens, cost, latency_ms, estimated, latency FROM usage_rollup \
         WHERE bucket_ms >= ?1 AND bucket_ms < ?2",
    );
    filters(q, &mut sql, &mut args);
    each_row(conn, &sql, &args, |r| {
        // A sum past i64 is a REAL in SQLite (a store written before counts were capped).
        let g = |i| {
            r.get::<_, i64>(i)
                .or_else(|_| r.get::<_, f64>(i).map(|f| f as i64))
                .map(uint)
        };
        let model: String = r.get(2)?;
        let hist = out.latency.entry(model.clone()).or_default();
        add_encoded(hist, r.get_ref(11)?.as_blob()?);
        out.rows.push(RollupRow {
            bucket_ms: r.get(0)?,
            key_id: r.get(1)?,
            model,
            status: u16::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
            sums: Sums {
                requests: g(4)?,
                prompt_tokens: g(5)?,
                completion_tokens: g(6)?,
                total_tokens: g(7)?,
                cost: r.get(8)?,
                latency_ms: g(9)?,
                estimated: g(10)?,
            },
        });
        Ok(())
    })
}

/// Sums the raw rows of `[from, to)` (less than one bucket) into `out`.
fn raw_rows(
    conn: &Connection,
    q: &RollupQuery,
    from: i64,
    to: i64,
    out: &mut Rollup,
) -> Result<(), StoreError> {
    let mut args = vec![Value::Integer(from), Value::Integer(to)];
    let mut sql =
        format!("SELECT {SELECT_COLUMNS} FROM usage WHERE time_ms >= ?1 AND time_ms < ?2");
    filters(q, &mut sql, &mut args);
    let mut records = Vec::new();
    let mut rec = blank_record();
    each_row(conn, &sql, &args, |row| {
        read_row(row, &mut rec)?;
        records.push(rec.clone());
        Ok(())
    })?;
    push_records(out, &records);
    Ok(())
}
