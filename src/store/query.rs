//! Store stage, read side: the usage query (one page, keyset cursor) and the streaming CSV
//! export. Both walk (time_ms, rowid) ascending from an inclusive lower bound, never OFFSET, so
//! the millionth row costs what the first does.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use rusqlite::{Connection, params};

use super::record::{CSV_HEADER, UsageRecord};
use super::sqlite::{SELECT_COLUMNS, blank_record, read_row};

#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// None = every key (the console).
    pub key_id: Option<String>,
    /// Inclusive, unix milliseconds.
    pub start_ms: i64,
    /// Exclusive, unix milliseconds.
    pub end_ms: i64,
    /// Page size for `Store::query` (0 is taken as 1; callers cap it); ignored by exports.
    pub limit: usize,
    pub cursor: Option<Cursor>,
}

/// Where the previous page stopped: the last row it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub time_ms: i64,
    pub rowid: i64,
}

impl Cursor {
    /// Opaque and URL-safe: base64url (no padding) of both numbers big-endian.
    pub fn encode(&self) -> String {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&self.time_ms.to_be_bytes());
        raw[8..].copy_from_slice(&self.rowid.to_be_bytes());
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// None for anything `encode` did not produce.
    pub fn decode(s: &str) -> Option<Cursor> {
        let raw = URL_SAFE_NO_PAD.decode(s.trim()).ok()?;
        if raw.len() != 16 {
            return None;
        }
        let time_ms = i64::from_be_bytes(raw[..8].try_into().ok()?);
        let rowid = i64::from_be_bytes(raw[8..].try_into().ok()?);
        Some(Cursor { time_ms, rowid })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub records: Vec<UsageRecord>,
    /// Some iff more rows may follow; pass it back as `Query::cursor` for the next page.
    pub next_cursor: Option<Cursor>,
}

/// Rows per SELECT during an export: big enough that restarting the statement is noise, small
/// enough that each page's read transaction is short (a long one would hold WAL checkpoints).
const EXPORT_PAGE: usize = 4_096;

/// Export chunks handed to the sink are about this size.
const CHUNK: usize = 64 * 1024;

/// The first (time_ms, rowid) to return, inclusive: the query's start, or just past the
/// cursor when that is later; None when the cursor is already past the end of the key space.
fn lower_bound(start_ms: i64, cursor: Option<Cursor>) -> Option<(i64, i64)> {
    let start = (start_ms, i64::MIN);
    let Some(c) = cursor else {
        return Some(start);
    };
    let after = match c.rowid.checked_add(1) {
        Some(rowid) => (c.time_ms, rowid),
        None => (c.time_ms.checked_add(1)?, i64::MIN),
    };
    Some(after.max(start))
}

/// ?1, ?2: inclusive (time_ms, rowid) lower bound; ?3: exclusive end; ?4: limit; ?5: key.
/// The redundant `time_ms >= ?1` keeps a plain range on the index even where the planner
/// would not use the row-value comparison for one.
fn select_sql(keyed: bool) -> String {
    let key = if keyed { "key_id = ?5 AND " } else { "" };
    format!(
        "SELECT {SELECT_COLUMNS} FROM usage WHERE {key}time_ms >= ?1 \
         AND (time_ms, rowid) >= (?1, ?2) AND time_ms < ?3 ORDER BY time_ms, rowid LIMIT ?4"
    )
}

/// Runs one keyset SELECT from `from` (inclusive) and calls `each` per row with its rowid;
/// `each` returns false to stop early. Returns the number of rows seen.
fn scan(
    conn: &Connection,
    q: &Query,
    from: (i64, i64),
    limit: usize,
    each: &mut dyn FnMut(i64, &UsageRecord) -> bool,
) -> Result<usize, String> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let sql_err = |e: rusqlite::Error| format!("usage store: query: {e}");
    let key = q.key_id.as_deref();
    let sql = select_sql(key.is_some());
    let mut stmt = conn.prepare_cached(&sql).map_err(sql_err)?;
    let mut rows = match key {
        Some(key) => stmt.query(params![from.0, from.1, q.end_ms, limit, key]),
        None => stmt.query(params![from.0, from.1, q.end_ms, limit]),
    }
    .map_err(sql_err)?;
    let mut rec = blank_record();
    let mut seen = 0;
    while let Some(row) = rows.next().map_err(sql_err)? {
        let rowid = read_row(row, &mut rec).map_err(sql_err)?;
        seen += 1;
        if !each(rowid, &rec) {
            break;
        }
    }
    Ok(seen)
}

pub(super) fn page(conn: &Connection, q: &Query) -> Result<Page, String> {
    let limit = q.limit.max(1);
    let empty = Page {
        records: Vec::new(),
        next_cursor: None,
    };
    let Some(from) = lower_bound(q.start_ms, q.cursor) else {
        return Ok(empty);
    };
    let mut records = Vec::with_capacity(limit.min(1024));
    let mut last = None;
    let mut more = false;
    // One row past the page tells whether another page exists.
    scan(conn, q, from, limit.saturating_add(1), &mut |rowid, rec| {
        if records.len() == limit {
            more = true;
            return false;
        }
        records.push(rec.clone());
        last = Some(Cursor {
            time_ms: rec.time_ms,
            rowid,
        });
        true
    })?;
    Ok(Page {
        records,
        next_cursor: if more { last } else { None },
    })
}

/// Streams the header and every matching row as CSV chunks of about `CHUNK` bytes, one
/// `EXPORT_PAGE` SELECT at a time; memory holds one page of CSV (well under a MiB) and one row.
/// Stops when `sink` returns false. Returns the rows in chunks handed to the sink.
pub(super) fn export(
    conn: &Connection,
    q: &Query,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<u64, String> {
    let mut buf = String::with_capacity(CHUNK + 1024);
    buf.push_str(CSV_HEADER);
    buf.push('\n');
    let mut from = lower_bound(q.start_ms, q.cursor);
    let mut in_buf: u64 = 0;
    let mut sent: u64 = 0;
    // Full chunks of the current page with their row counts.
    let mut ready: Vec<(Bytes, u64)> = Vec::new();
    while let Some(start) = from {
        let mut last = None;
        let seen = scan(conn, q, start, EXPORT_PAGE, &mut |rowid, rec| {
            rec.write_csv(&mut buf);
            in_buf += 1;
            last = Some((rec.time_ms, rowid));
            if buf.len() >= CHUNK {
                let chunk = std::mem::replace(&mut buf, String::with_capacity(CHUNK + 1024));
                ready.push((Bytes::from(chunk), std::mem::take(&mut in_buf)));
            }
            true
        })?;
        // The page's statement is done, so its read snapshot is released before the sink
        // runs: a slow client cannot hold back WAL checkpoints for the whole export.
        for (chunk, rows) in ready.drain(..) {
            sent += rows;
            if !sink(chunk) {
                return Ok(sent);
            }
        }
        from = match last {
            Some((time_ms, rowid)) if seen == EXPORT_PAGE => {
                lower_bound(q.start_ms, Some(Cursor { time_ms, rowid }))
            }
            _ => None,
        };
    }
    if !buf.is_empty() {
        sent += in_buf;
        sink(Bytes::from(buf));
    }
    Ok(sent)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::store::sqlite::sample_record;
    use crate::store::{Store, StoreOptions};

    fn all(key: Option<&str>, start_ms: i64, end_ms: i64, limit: usize) -> Query {
        Query {
            key_id: key.map(String::from),
            start_ms,
            end_ms,
            limit,
            cursor: None,
        }
    }

    fn store_with(records: &[UsageRecord]) -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("u.db"), StoreOptions::default()).unwrap();
        for r in records {
            store.record(r.clone());
        }
        assert!(store.flush(Duration::from_secs(30)));
        (dir, store)
    }

    fn every_page(store: &Store, mut q: Query) -> Vec<UsageRecord> {
        let mut out = Vec::new();
        loop {
            let page = store.query(&q).unwrap();
            assert!(page.records.len() <= q.limit.max(1));
            out.extend(page.records);
            match page.next_cursor {
                // Through the string form, as a client would.
                Some(c) => q.cursor = Some(Cursor::decode(&c.encode()).unwrap()),
                None => return out,
            }
        }
    }

    #[test]
    fn cursors_round_trip_and_garbage_decodes_to_none() {
        for c in [
            Cursor {
                time_ms: 0,
                rowid: 0,
            },
            Cursor {
                time_ms: -5,
                rowid: i64::MAX,
            },
            Cursor {
                time_ms: 1_795_353_265_123,
                rowid: 42,
            },
        ] {
            let s = c.encode();
            assert!(
                s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            );
            assert_eq!(Cursor::decode(&s), Some(c));
        }
        for bad in [
            "",
            "garbage",
            "!!!!",
            "AAAA",
            "AAAAAAAAAAAAAAAAAAAAAAAAA",
            "12-34",
            "é",
        ] {
            assert_eq!(Cursor::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn pages_return_every_row_exactly_once_in_order() {
        // Many rows share a millisecond, so the rowid tie-break matters.
        let records: Vec<UsageRecord> = (0..1_000)
            .map(|i| sample_record(i, "k", 1_000 + (i as i64 / 10)))
            .collect();
        let (_dir, store) = store_with(&records);
        for limit in [1, 7, 100, 999, 1_000, 5_000] {
            assert_eq!(
                every_page(&store, all(Some("k"), 0, i64::MAX, limit)),
                records,
                "{limit}"
            );
        }
        assert_eq!(every_page(&store, all(None, 0, i64::MAX, 33)), records);
        let first = store.query(&all(None, 0, i64::MAX, 1_000)).unwrap();
        assert_eq!(first.next_cursor, None, "an exact fit has no next page");
        let cut = store.query(&all(None, 0, i64::MAX, 999)).unwrap();
        assert!(cut.next_cursor.is_some());
    }

    #[test]
    fn the_time_filter_includes_start_and_excludes_end() {
        let records: Vec<UsageRecord> = [100, 200, 200, 299, 300]
            .iter()
            .enumerate()
            .map(|(i, t)| sample_record(i as u64, "k", *t))
            .collect();
        let (_dir, store) = store_with(&records);
        let page = store.query(&all(Some("k"), 200, 300, 100)).unwrap();
        assert_eq!(page.records, records[1..4].to_vec());
        assert!(
            store
                .query(&all(None, 300, 300, 100))
                .unwrap()
                .records
                .is_empty()
        );
        // A cursor from before the window does not widen it.
        let mut q = all(None, 200, 301, 100);
        q.cursor = Some(Cursor {
            time_ms: 0,
            rowid: 0,
        });
        assert_eq!(store.query(&q).unwrap().records, records[1..].to_vec());
    }

    #[test]
    fn a_key_sees_only_its_own_rows() {
        let records: Vec<UsageRecord> = (0..300)
            .map(|i| sample_record(i, ["a", "b", "c"][i as usize % 3], 1_000 + i as i64))
            .collect();
        let (_dir, store) = store_with(&records);
        let b: Vec<UsageRecord> = records
            .iter()
            .filter(|r| r.key_id == "b")
            .cloned()
            .collect();
        assert_eq!(every_page(&store, all(Some("b"), 0, i64::MAX, 17)), b);
        assert!(
            store
                .query(&all(Some("nobody"), 0, i64::MAX, 10))
                .unwrap()
                .records
                .is_empty()
        );
        assert_eq!(every_page(&store, all(None, 0, i64::MAX, 64)).len(), 300);
    }

    #[test]
    fn export_is_the_header_then_each_row_in_order_and_stops_when_asked() {
        // Enough rows for several pages and many chunks.
        let records: Vec<UsageRecord> = (0..10_000)
            .map(|i| sample_record(i, if i % 4 == 0 { "x" } else { "k" }, i as i64 / 3))
            .collect();
        let (_dir, store) = store_with(&records);
        let mut expected = format!("{CSV_HEADER}\n");
        for r in records.iter().filter(|r| r.key_id == "k") {
            r.write_csv(&mut expected);
        }
        let mut got = Vec::new();
        let mut chunks = 0;
        let q = all(Some("k"), 0, i64::MAX, 1);
        let rows = store
            .export_csv(&q, &mut |b| {
                assert!(b.len() <= CHUNK + 1024);
                chunks += 1;
                got.extend_from_slice(&b);
                true
            })
            .unwrap();
        assert_eq!(rows, 7_500);
        assert!(chunks > 5);
        assert_eq!(String::from_utf8(got).unwrap(), expected);

        let mut first = Vec::new();
        let mut calls = 0;
        let rows = store
            .export_csv(&q, &mut |b| {
                calls += 1;
                first.extend_from_slice(&b);
                false
            })
            .unwrap();
        assert_eq!(calls, 1);
        assert!(first.len() >= CHUNK);
        assert!(expected.as_bytes().starts_with(&first));
        assert_eq!(
            rows as usize,
            first.iter().filter(|&&b| b == b'\n').count() - 1
        );

        let mut empty = Vec::new();
        let rows = store
            .export_csv(&all(Some("nobody"), 0, i64::MAX, 1), &mut |b| {
                empty.extend_from_slice(&b);
                true
            })
            .unwrap();
        assert_eq!(rows, 0);
        assert_eq!(empty, format!("{CSV_HEADER}\n").as_bytes());
    }

    #[test]
    fn both_queries_walk_an_index_without_sorting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        let _store = Store::open(&path, StoreOptions::default()).unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        for (keyed, index) in [(true, "usage_key_time"), (false, "usage_time")] {
            let sql = format!("EXPLAIN QUERY PLAN {}", select_sql(keyed));
            let mut stmt = conn.prepare(&sql).unwrap();
            let mut rows = if keyed {
                stmt.query(params![0, 0, 0, 0, "k"]).unwrap()
            } else {
                stmt.query(params![0, 0, 0, 0]).unwrap()
            };
            let mut plan = Vec::new();
            while let Some(row) = rows.next().unwrap() {
                plan.push(row.get::<_, String>(3).unwrap());
            }
            let plan = plan.join(" | ");
            assert!(plan.contains(index), "{plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{plan}");
        }
    }
}
