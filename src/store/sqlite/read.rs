//! Store stage, the SQLite engine's reads: one page of the usage query, the side-by-side
//! export's slices and the CSV stream, on a reader connection.

use bytes::Bytes;
use rusqlite::fallible_streaming_iterator::FallibleStreamingIterator;
use rusqlite::types::Value;
use rusqlite::{Connection, Row, Rows, params_from_iter};

use super::rows::{blank_record, csv_row, read_row};
use crate::store::StoreError;
use crate::store::query::{
    Arg, CHUNK, CsvOut, Cursor, Dialect, EXPORT_PAGE, Page, Query, first_bound, select_in,
};

fn select(q: &Query, from: (i64, i64), limit: usize) -> (String, Vec<Value>) {
    let (sql, args) = select_in(Dialect::Sqlite, q, from, limit);
    let args = args
        .into_iter()
        .map(|a| match a {
            Arg::Int(i) => Value::Integer(i),
            Arg::Text(t) => Value::Text(t),
        })
        .collect();
    (sql, args)
}

/// Runs one keyset SELECT from `from` and calls `each` per row; `each` returns false to stop
/// early. Returns the number of rows seen.
fn scan(
    conn: &Connection,
    q: &Query,
    from: (i64, i64),
    limit: usize,
    each: &mut dyn FnMut(&Row<'_>) -> Result<bool, StoreError>,
) -> Result<usize, StoreError> {
    let (sql, args) = select(q, from, limit);
    let mut stmt = conn.prepare_cached(&sql).map_err(StoreError::query)?;
    let mut rows = stmt
        .query(params_from_iter(args))
        .map_err(StoreError::query)?;
    let mut seen = 0;
    while let Some(row) = rows.next().map_err(StoreError::query)? {
        seen += 1;
        if !each(row)? {
            break;
        }
    }
    Ok(seen)
}

pub(super) fn page(conn: &Connection, q: &Query) -> Result<Page, StoreError> {
    let limit = q.limit.max(1);
    let empty = Page {
        records: Vec::new(),
        next_cursor: None,
    };
    let Some(from) = first_bound(q, q.cursor) else {
        return Ok(empty);
    };
    let mut records = Vec::with_capacity(limit.min(1024));
    let mut last = None;
    let mut more = false;
    // One row past the page tells whether another page exists.
    scan(conn, q, from, limit.saturating_add(1), &mut |row| {
        if records.len() == limit {
            more = true;
            return Ok(false);
        }
        let mut rec = blank_record();
        let seq = read_row(row, &mut rec).map_err(StoreError::query)?;
        last = Some(Cursor {
            time_ms: rec.time_ms,
            seq,
        });
        records.push(rec);
        Ok(true)
    })?;
    Ok(Page {
        records,
        next_cursor: if more { last } else { None },
    })
}

/// An export across every key merges one walk per key (each sequential in the key-clustered
/// table) instead of walking the time index, which would seek the table once per row; above
/// this many keys the per-round statements cost more than the seeks save.
const MERGE_MAX_KEYS: usize = 64;

/// Every key that has ever been recorded (the spend table gains a key with its first row), or
/// None when there are too many to merge.
fn keys_to_merge(conn: &Connection) -> Result<Option<Vec<String>>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT key_id FROM spend LIMIT ?1")
        .map_err(StoreError::query)?;
    let keys = stmt
        .query_map([MERGE_MAX_KEYS as i64 + 1], |r| r.get::<_, String>(0))
        .map_err(StoreError::query)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(StoreError::query)?;
    Ok((keys.len() <= MERGE_MAX_KEYS).then_some(keys))
}

/// One prepared walk per key for `merge_scan`, kept for the whole export (the SQL is the
/// same for every key; the key is its first parameter).
struct Merge<'c> {
    keys: Vec<String>,
    stmts: Vec<rusqlite::Statement<'c>>,
}

impl<'c> Merge<'c> {
    /// The walks for `keys`, reusing `prev`'s when the keys have not changed.
    fn for_keys(
        conn: &'c Connection,
        q: &Query,
        keys: Vec<String>,
        prev: Option<Merge<'c>>,
    ) -> Result<Merge<'c>, StoreError> {
        if let Some(prev) = prev.filter(|p| p.keys == keys) {
            return Ok(prev);
        }
        let one = Query {
            key_id: Some(String::new()),
            ..q.clone()
        };
        let (sql, _) = select(&one, (0, 0), 0);
        let stmts = keys
            .iter()
            .map(|_| conn.prepare(&sql).map_err(StoreError::query))
            .collect::<Result<_, _>>()?;
        Ok(Merge { keys, stmts })
    }
}

/// Like `scan` across every key: one walk per key, their rows merged in (time_ms, seq) order
/// (descending for `q.desc`). Each key's walk is sequential in the key-clustered table.
fn merge_scan(
    merge: &mut Merge<'_>,
    q: &Query,
    from: (i64, i64),
    limit: usize,
    each: &mut dyn FnMut(&Row<'_>) -> Result<bool, StoreError>,
) -> Result<usize, StoreError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut walks = Vec::with_capacity(merge.stmts.len());
    for (stmt, key) in merge.stmts.iter_mut().zip(&merge.keys) {
        let one = Query {
            key_id: Some(key.clone()),
            ..q.clone()
        };
        let (_, args) = select(&one, from, limit);
        walks.push(
            stmt.query(params_from_iter(args))
                .map_err(StoreError::query)?,
        );
    }
    // `!x` reverses the order of i64 without overflow, so the max-heap pops the oldest first.
    let order = |t: i64, s: i64| if q.desc { (t, s) } else { (!t, !s) };
    // The heap holds each walk's current (time_ms, seq); the row itself stays in its walk.
    let mut heap = BinaryHeap::with_capacity(walks.len());
    let step = |walk: &mut Rows<'_>| -> Result<Option<(i64, i64)>, StoreError> {
        match walk.next().map_err(StoreError::query)? {
            Some(row) => {
                let at = (row.get(1), row.get(0));
                match at {
                    (Ok(t), Ok(s)) => Ok(Some(order(t, s))),
                    (Err(e), _) | (_, Err(e)) => Err(StoreError::query(e)),
                }
            }
            None => Ok(None),
        }
    };
    for (i, walk) in walks.iter_mut().enumerate() {
        if let Some(at) = step(walk)? {
            heap.push((at, Reverse(i)));
        }
    }
    let mut seen = 0;
    while seen < limit {
        let Some((_, Reverse(i))) = heap.pop() else {
            break;
        };
        let Some(walk) = walks.get_mut(i) else { break };
        let Some(row) = walk.get() else { break };
        seen += 1;
        if !each(row)? {
            break;
        }
        if let Some(at) = step(walk)? {
            heap.push((at, Reverse(i)));
        }
    }
    Ok(seen)
}

/// Streams the header and every matching row as CSV, on this connection alone.
pub(super) fn export(
    conn: &Connection,
    q: &Query,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<u64, StoreError> {
    let mut out = CsvOut::new(sink);
    if export_rows(conn, q, &mut |chunk, rows| out.put(chunk, rows))? {
        return Ok(out.finish());
    }
    Ok(out.sent)
}

/// Rows (by the rollups' count) in one slice of a side-by-side export: about 600 KiB of CSV
/// (unit tests cut small slices to see many).
pub(super) const SLICE_ROWS: u64 = if cfg!(test) { 300 } else { 4_096 };

/// `q`'s range cut into slices of about `SLICE_ROWS` rows each, in walk order (newest first
/// for `desc`), each a query of its own. The rollups tell how many rows each 15-minute bucket
/// holds (filters on model or status only make a slice smaller); a bucket with more is cut in
/// equal stretches of time. One slice when there is little to cut.
pub(super) fn slices(conn: &Connection, q: &Query) -> Result<Vec<Query>, StoreError> {
    use crate::store::rollup::{BUCKET_MS, bucket_of};
    let key = if q.key_id.is_some() {
        "key_id = ?3 AND "
    } else {
        ""
    };
    let sql = format!(
        "SELECT bucket_ms, SUM(requests) FROM usage_rollup WHERE {key}bucket_ms >= ?1 \
         AND bucket_ms < ?2 GROUP BY bucket_ms ORDER BY bucket_ms"
    );
    let mut args = vec![
        Value::Integer(bucket_of(q.start_ms)),
        Value::Integer(q.end_ms),
    ];
    if let Some(k) = &q.key_id {
        args.push(Value::Text(k.clone()));
    }
    let mut stmt = conn.prepare_cached(&sql).map_err(StoreError::query)?;
    let mut rows = stmt
        .query(params_from_iter(args))
        .map_err(StoreError::query)?;
    // Inner cuts, ascending; a slice ends where the next begins.
    let mut cuts = Vec::new();
    let mut filled: u64 = 0;
    while let Some(row) = rows.next().map_err(StoreError::query)? {
        let bucket: i64 = row.get(0).map_err(StoreError::query)?;
        let count = u64::try_from(row.get::<_, i64>(1).map_err(StoreError::query)?).unwrap_or(0);
        if filled + count > SLICE_ROWS && filled > 0 {
            cuts.push(bucket);
            filled = 0;
        }
        let parts = count / SLICE_ROWS;
        for part in 1..=parts.min(BUCKET_MS as u64) {
            let at = bucket + (BUCKET_MS as u64 * part / (parts + 1)) as i64;
            cuts.push(at);
        }
        filled = if parts == 0 {
            filled + count
        } else {
            count / (parts + 1)
        };
    }
    cuts.retain(|&c| c > q.start_ms && c < q.end_ms);
    cuts.dedup();
    let mut bounds = Vec::with_capacity(cuts.len() + 2);
    bounds.push(q.start_ms);
    bounds.extend(cuts);
    bounds.push(q.end_ms);
    let mut out: Vec<Query> = bounds
        .windows(2)
        .map(|w| Query {
            start_ms: w[0],
            end_ms: w[1],
            ..q.clone()
        })
        .collect();
    if q.desc {
        out.reverse();
    }
    Ok(out)
}

/// Every matching row as CSV chunks of about `CHUNK` bytes (no header), one `EXPORT_PAGE`
/// SELECT (or merge round) at a time; memory holds one page of CSV (well under a MiB) and one
/// row per merged key. `emit` takes a chunk and its row count and returns false to stop.
/// Returns true when every row was emitted.
pub(super) fn export_rows(
    conn: &Connection,
    q: &Query,
    emit: &mut dyn FnMut(Bytes, u64) -> bool,
) -> Result<bool, StoreError> {
    let mut buf = Vec::with_capacity(CHUNK + 1024);
    let mut from = first_bound(q, q.cursor);
    let mut in_buf: u64 = 0;
    // Full chunks of the current page with their row counts.
    let mut ready: Vec<(Bytes, u64)> = Vec::new();
    let mut merge: Option<Merge<'_>> = None;
    while let Some(start) = from {
        let mut last = None;
        let mut each = |row: &Row<'_>| {
            let (seq, csv) = csv_row(row).map_err(StoreError::query)?;
            csv.write(&mut buf);
            in_buf += 1;
            last = Some((csv.time_ms, seq));
            if buf.len() >= CHUNK {
                let chunk = std::mem::replace(&mut buf, Vec::with_capacity(CHUNK + 1024));
                ready.push((Bytes::from(chunk), std::mem::take(&mut in_buf)));
            }
            Ok(true)
        };
        // Keys are listed again each round, so one first seen mid-export is not missed.
        merge = match q.key_id {
            Some(_) => None,
            None => match keys_to_merge(conn)? {
                Some(keys) => Some(Merge::for_keys(conn, q, keys, merge.take())?),
                None => None,
            },
        };
        let seen = match &mut merge {
            Some(m) => merge_scan(m, q, start, EXPORT_PAGE, &mut each)?,
            None => scan(conn, q, start, EXPORT_PAGE, &mut each)?,
        };
        // The page's statements are done, so their read snapshot is released before the sink
        // runs: a slow client cannot hold back WAL checkpoints for the whole export.
        for (chunk, rows) in ready.drain(..) {
            if !emit(chunk, rows) {
                return Ok(false);
            }
        }
        from = match last {
            Some((time_ms, seq)) if seen == EXPORT_PAGE => {
                first_bound(q, Some(Cursor { time_ms, seq }))
            }
            _ => None,
        };
    }
    if !buf.is_empty() {
        return Ok(emit(Bytes::from(buf), in_buf));
    }
    Ok(true)
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
