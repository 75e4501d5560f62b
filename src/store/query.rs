//! Store stage, read side, for every engine: the usage query (one page, keyset cursor), the
//! keyset SELECT in each engine's dialect, and the CSV stream's framing. Both walk (time_ms,
//! seq) from a bound, never OFFSET, so the millionth row costs what the first does; each
//! engine runs them (`sqlite/read.rs`, `postgres/read.rs`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;

use super::record::{CSV_HEADER, UsageRecord};

#[derive(Debug, Clone, PartialEq, Default)]
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
    /// Newest first (the cursor then walks backwards).
    pub desc: bool,
    /// Only this model (exact).
    pub model: Option<String>,
    /// Only statuses in this inclusive range (`429`, or `400..=499` for `4xx`).
    pub status: Option<(u16, u16)>,
}

/// Where the previous page stopped: the last row it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub time_ms: i64,
    pub seq: i64,
}

impl Cursor {
    /// Opaque and URL-safe: base64url (no padding) of both numbers big-endian.
    pub fn encode(&self) -> String {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&self.time_ms.to_be_bytes());
        raw[8..].copy_from_slice(&self.seq.to_be_bytes());
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// None for anything `encode` did not produce.
    pub fn decode(s: &str) -> Option<Cursor> {
        let raw = URL_SAFE_NO_PAD.decode(s.trim()).ok()?;
        if raw.len() != 16 {
            return None;
        }
        let time_ms = i64::from_be_bytes(raw[..8].try_into().ok()?);
        let seq = i64::from_be_bytes(raw[8..].try_into().ok()?);
        Some(Cursor { time_ms, seq })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub records: Vec<UsageRecord>,
    /// Some iff more rows may follow; pass it back as `Query::cursor` for the next page.
    pub next_cursor: Option<Cursor>,
}

/// The column list every reader selects, `seq` first; `read_row` follows this order.
pub(super) const SELECT_COLUMNS: &str = "seq, time_ms, request_id, key_id, listener, endpoint, \
     model, status, stream, prompt_tokens, completion_tokens, total_tokens, cost, latency_ms, \
     ttft_ms, upstream, estimated, attempts, served_model, cut, cached_prompt_tokens, \
     cache_write_tokens, reasoning_tokens";

/// Rows per SELECT during an export: big enough that restarting the statement is noise, small
/// enough that each page's read transaction is short (a long one would hold WAL checkpoints).
pub(super) const EXPORT_PAGE: usize = 4_096;

/// Export chunks handed to the sink are about this size.
pub(super) const CHUNK: usize = 64 * 1024;

/// Where a walk starts: the first (time_ms, seq) to return. Ascending it is inclusive (the
/// query's start, or just past the cursor); descending it is exclusive (the query's end, or
/// the cursor). None when the cursor already lies past the end of the key space.
pub(super) fn first_bound(q: &Query, cursor: Option<Cursor>) -> Option<(i64, i64)> {
    if q.desc {
        let end = (q.end_ms, i64::MIN);
        return Some(cursor.map_or(end, |c| (c.time_ms, c.seq).min(end)));
    }
    let start = (q.start_ms, i64::MIN);
    let Some(c) = cursor else {
        return Some(start);
    };
    let after = match c.seq.checked_add(1) {
        Some(seq) => (c.time_ms, seq),
        None => (c.time_ms.checked_add(1)?, i64::MIN),
    };
    Some(after.max(start))
}

/// A value bound to one of a query's placeholders.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Arg {
    Int(i64),
    Text(String),
}

/// Whose placeholders a query is written with: SQLite's `?N` or Postgres's typed `$N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    Sqlite,
    Postgres,
}

/// The SELECT for one keyset page and its parameters, in order. Ascending:
/// `(time_ms, seq) >= bound AND time_ms < end`; descending:
/// `(time_ms, seq) < bound AND time_ms >= start`.
/// The redundant plain `time_ms` bound keeps a range on the index even where the planner would
/// not use the row-value comparison for one. Filters on model and status are checked on the
/// rows the index walk yields.
pub(super) fn select_in(
    dialect: Dialect,
    q: &Query,
    from: (i64, i64),
    limit: usize,
) -> (String, Vec<Arg>) {
    let mut sql = format!("SELECT {SELECT_COLUMNS} FROM usage WHERE ");
    let mut args: Vec<Arg> = Vec::with_capacity(8);
    let mut arg = |sql: &mut String, text: &str, v: Arg| {
        let n = args.len() + 1;
        let at = match (dialect, &v) {
            (Dialect::Sqlite, _) => format!("?{n}"),
            (Dialect::Postgres, Arg::Int(_)) => format!("${n}::bigint"),
            (Dialect::Postgres, Arg::Text(_)) => format!("${n}::text"),
        };
        args.push(v);
        sql.push_str(&text.replace('?', &at));
    };
    if let Some(key) = &q.key_id {
        arg(&mut sql, "key_id = ? AND ", Arg::Text(key.clone()));
    }
    if let Some(model) = &q.model {
        arg(&mut sql, "model = ? AND ", Arg::Text(model.clone()));
    }
    if let Some((lo, hi)) = q.status {
        arg(&mut sql, "status >= ? AND ", Arg::Int(lo.into()));
        arg(&mut sql, "status <= ? AND ", Arg::Int(hi.into()));
    }
    let (t, r) = (Arg::Int(from.0), Arg::Int(from.1));
    if q.desc {
        arg(&mut sql, "time_ms >= ? AND ", Arg::Int(q.start_ms));
        arg(&mut sql, "time_ms <= ? AND ", t.clone());
        arg(&mut sql, "(time_ms, seq) < (?, ", t);
        arg(&mut sql, "?) ORDER BY time_ms DESC, seq DESC ", r);
    } else {
        arg(&mut sql, "time_ms >= ? AND ", t.clone());
        arg(&mut sql, "(time_ms, seq) >= (?, ", t);
        arg(&mut sql, "?) AND ", r);
        arg(
            &mut sql,
            "time_ms < ? ORDER BY time_ms, seq ",
            Arg::Int(q.end_ms),
        );
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    arg(&mut sql, "LIMIT ?", Arg::Int(limit));
    (sql, args)
}

/// Where an export's chunks go: the CSV header in front of the first (alone when there are no
/// rows), then each chunk as it comes; counts the rows in chunks handed over.
pub(super) struct CsvOut<'s> {
    sink: &'s mut dyn FnMut(Bytes) -> bool,
    header_sent: bool,
    pub sent: u64,
}

impl<'s> CsvOut<'s> {
    pub fn new(sink: &'s mut dyn FnMut(Bytes) -> bool) -> CsvOut<'s> {
        CsvOut {
            sink,
            header_sent: false,
            sent: 0,
        }
    }

    /// Hands one chunk of `rows` rows over; false when the sink wants no more.
    pub fn put(&mut self, chunk: Bytes, rows: u64) -> bool {
        let chunk = if self.header_sent {
            chunk
        } else {
            self.header_sent = true;
            let mut first = Vec::with_capacity(CSV_HEADER.len() + 1 + chunk.len());
            first.extend_from_slice(CSV_HEADER.as_bytes());
            first.push(b'\n');
            first.extend_from_slice(&chunk);
            Bytes::from(first)
        };
        self.sent += rows;
        (self.sink)(chunk)
    }

    /// The header when no chunk carried it; returns the rows handed over.
    pub fn finish(mut self) -> u64 {
        if !self.header_sent {
            self.put(Bytes::new(), 0);
        }
        self.sent
    }
}
