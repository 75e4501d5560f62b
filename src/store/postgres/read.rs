//! Store stage, Postgres read side: keyset pages (the same SQL shape as SQLite's), CSV
//! exports streamed from a server-side cursor (a portal fetched `EXPORT_PAGE` rows at a time,
//! so memory stays flat whatever the range), and rollups read like SQLite's.

use bytes::Bytes;
use postgres::types::ToSql;
use postgres::{Client, Row};

use crate::store::StoreError;
use crate::store::query::{
    Arg, CHUNK, CsvOut, Cursor, Dialect, EXPORT_PAGE, Page, Query, first_bound, select_in,
};
use crate::store::record::{CsvRow, UsageRecord};
use crate::store::rollup::{self, Hist, Plan, Rollup, RollupQuery, RollupRow, Sums};

fn params(args: &[Arg]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter()
        .map(|a| match a {
            Arg::Int(i) => i as &(dyn ToSql + Sync),
            Arg::Text(t) => t as &(dyn ToSql + Sync),
        })
        .collect()
}

fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// One `SELECT_COLUMNS` row; returns its `seq` too.
fn record(row: &Row) -> Result<(i64, UsageRecord), postgres::Error> {
    Ok((
        row.try_get(0)?,
        UsageRecord {
            time_ms: row.try_get(1)?,
            request_id: row.try_get(2)?,
            key_id: row.try_get(3)?,
            listener: row.try_get(4)?,
            endpoint: row.try_get(5)?,
            model: row.try_get(6)?,
            status: u16::try_from(row.try_get::<_, i32>(7)?).unwrap_or(0),
            stream: row.try_get(8)?,
            prompt_tokens: uint(row.try_get(9)?),
            completion_tokens: uint(row.try_get(10)?),
            total_tokens: uint(row.try_get(11)?),
            cost: row.try_get(12)?,
            latency_ms: uint(row.try_get(13)?),
            ttft_ms: row.try_get::<_, Option<i64>>(14)?.map(uint),
            upstream: row.try_get(15)?,
            estimated: row.try_get(16)?,
            attempts: u32::try_from(row.try_get::<_, i32>(17)?).unwrap_or(0),
            served_model: row.try_get(18)?,
            cut: row.try_get(19)?,
            cached_prompt_tokens: uint(row.try_get(20)?),
            cache_write_tokens: uint(row.try_get(21)?),
            reasoning_tokens: uint(row.try_get(22)?),
        },
    ))
}

/// One row as CSV fields, borrowed from the row.
fn csv_row(row: &Row) -> Result<CsvRow<'_>, postgres::Error> {
    let text = |i| row.try_get::<_, &str>(i).map(str::as_bytes);
    Ok(CsvRow {
        time_ms: row.try_get(1)?,
        request_id: text(2)?,
        key_id: text(3)?,
        listener: text(4)?,
        endpoint: text(5)?,
        model: text(6)?,
        status: u64::try_from(row.try_get::<_, i32>(7)?).unwrap_or(0),
        stream: row.try_get(8)?,
        prompt_tokens: uint(row.try_get(9)?),
        completion_tokens: uint(row.try_get(10)?),
        total_tokens: uint(row.try_get(11)?),
        cost: row.try_get(12)?,
        latency_ms: uint(row.try_get(13)?),
        ttft_ms: row.try_get::<_, Option<i64>>(14)?.map(uint),
        upstream: text(15)?,
        estimated: row.try_get(16)?,
        attempts: u64::try_from(row.try_get::<_, i32>(17)?).unwrap_or(0),
        served_model: text(18)?,
        cut: text(19)?,
        details: [
            uint(row.try_get(20)?),
            uint(row.try_get(21)?),
            uint(row.try_get(22)?),
        ],
    })
}

pub(super) fn page(c: &mut Client, q: &Query) -> Result<Page, StoreError> {
    let limit = q.limit.max(1);
    let Some(from) = first_bound(q, q.cursor) else {
        return Ok(Page {
            records: Vec::new(),
            next_cursor: None,
        });
    };
    // One row past the page tells whether another page exists.
    let (sql, args) = select_in(Dialect::Postgres, q, from, limit.saturating_add(1));
    let rows = c.query(&sql, &params(&args)).map_err(StoreError::pg)?;
    let more = rows.len() > limit;
    let mut records = Vec::with_capacity(rows.len().min(limit));
    let mut last = None;
    for row in rows.iter().take(limit) {
        let (seq, rec) = record(row).map_err(StoreError::pg)?;
        last = Some(Cursor {
            time_ms: rec.time_ms,
            seq,
        });
        records.push(rec);
    }
    Ok(Page {
        records,
        next_cursor: if more { last } else { None },
    })
}

/// The header and every matching row as CSV, from one server-side cursor in one read-only
/// transaction (one consistent snapshot for the whole file).
pub(super) fn export(
    c: &mut Client,
    q: &Query,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<u64, StoreError> {
    let mut out = CsvOut::new(sink);
    let Some(from) = first_bound(q, q.cursor) else {
        return Ok(out.finish());
    };
    let (sql, args) = select_in(Dialect::Postgres, q, from, usize::MAX);
    let mut tx = c
        .build_transaction()
        .read_only(true)
        .start()
        .map_err(StoreError::pg)?;
    let portal = tx.bind(&sql, &params(&args)).map_err(StoreError::pg)?;
    let fetch = i32::try_from(EXPORT_PAGE).unwrap_or(i32::MAX);
    let mut buf = Vec::with_capacity(CHUNK + 1024);
    let mut in_buf: u64 = 0;
    loop {
        let rows = tx.query_portal(&portal, fetch).map_err(StoreError::pg)?;
        for row in &rows {
            csv_row(row).map_err(StoreError::pg)?.write(&mut buf);
            in_buf += 1;
            if buf.len() >= CHUNK {
                let chunk = std::mem::replace(&mut buf, Vec::with_capacity(CHUNK + 1024));
                if !out.put(Bytes::from(chunk), std::mem::take(&mut in_buf)) {
                    return Ok(out.sent);
                }
            }
        }
        if rows.len() < EXPORT_PAGE {
            break;
        }
    }
    if !buf.is_empty() && !out.put(Bytes::from(buf), in_buf) {
        return Ok(out.sent);
    }
    drop(tx);
    Ok(out.finish())
}

/// ` AND key_id = $N` / ` AND model = $N` for the filters the query has.
fn filters(q: &RollupQuery, sql: &mut String, args: &mut Vec<Arg>) {
    for (col, v) in [("key_id", &q.key_id), ("model", &q.model)] {
        if let Some(v) = v {
            args.push(Arg::Text(v.clone()));
            sql.push_str(&format!(" AND {col} = ${}::text", args.len()));
        }
    }
}

pub(super) fn rollup(c: &mut Client, q: &RollupQuery) -> Result<Rollup, StoreError> {
    let mut out = Rollup::default();
    let plan = Plan::of(q);
    if let Some((from, to)) = plan.whole {
        let mut args = vec![Arg::Int(from), Arg::Int(to)];
        let mut sql = String::from(
            "SELECT bucket_ms, key_id, model, status, requests, prompt_tokens, \
             completion_tokens, total_tokens, cost, latency_ms, estimated, latency \
             FROM usage_rollup WHERE bucket_ms >= $1::bigint AND bucket_ms < $2::bigint",
        );
        filters(q, &mut sql, &mut args);
        let rows = c.query(&sql, &params(&args)).map_err(StoreError::pg)?;
        for r in &rows {
            let (row, hist) = rollup_row(r).map_err(StoreError::pg)?;
            rollup::push_row(&mut out, row, &hist);
        }
    }
    for (from, to) in plan.edges {
        let mut args = vec![Arg::Int(from), Arg::Int(to)];
        let mut sql = format!(
            "SELECT {} FROM usage WHERE time_ms >= $1::bigint AND time_ms < $2::bigint",
            crate::store::query::SELECT_COLUMNS
        );
        filters(q, &mut sql, &mut args);
        let rows = c.query(&sql, &params(&args)).map_err(StoreError::pg)?;
        let records = rows
            .iter()
            .map(|r| record(r).map(|(_, rec)| rec))
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::pg)?;
        rollup::push_records(&mut out, &records);
    }
    out.rows.sort_by_key(|r| r.bucket_ms);
    Ok(out)
}

fn rollup_row(r: &Row) -> Result<(RollupRow, Hist), postgres::Error> {
    let g = |i| r.try_get::<_, i64>(i).map(uint);
    let mut hist = Hist::new();
    for (bin, n) in r.try_get::<_, Vec<i32>>(11)?.into_iter().enumerate() {
        if n > 0 {
            *hist
                .entry(u32::try_from(bin).unwrap_or(u32::MAX))
                .or_default() += u64::try_from(n).unwrap_or(0);
        }
    }
    let row = RollupRow {
        bucket_ms: r.try_get(0)?,
        key_id: r.try_get(1)?,
        model: r.try_get(2)?,
        status: u16::try_from(r.try_get::<_, i32>(3)?).unwrap_or(0),
        sums: Sums {
            requests: g(4)?,
            prompt_tokens: g(5)?,
            completion_tokens: g(6)?,
            total_tokens: g(7)?,
            cost: r.try_get(8)?,
            latency_ms: g(9)?,
            estimated: g(10)?,
        },
    };
    Ok((row, hist))
}
