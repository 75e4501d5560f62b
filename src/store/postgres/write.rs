//! Store stage, Postgres write side: one batch a transaction. Rows go in with one multi-row
//! INSERT (arrays unnested server-side) that skips request ids already stored, so a batch
//! retried after a lost COMMIT acknowledgement, or replayed from the spool, is never counted
//! twice; spend and rollups are advanced by exactly the rows that went in. Spend and rollup
//! rows are upserted in key order, so gateways writing at once never deadlock.

use std::collections::{BTreeMap, HashSet};

use postgres::error::SqlState;
use postgres::{Client, Config};

use super::{connect, pg_err};
use crate::store::engine::{BatchWriter, WriteError};
use crate::store::record::UsageRecord;
use crate::store::rollup::{self, Hist};

const INSERT: &str = "INSERT INTO usage (time_ms, request_id, key_id, listener, endpoint, \
     model, status, stream, prompt_tokens, completion_tokens, total_tokens, cost, latency_ms, \
     ttft_ms, upstream, estimated, attempts, served_model, cut, cached_prompt_tokens, \
     cache_write_tokens, reasoning_tokens) \
     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::text[], $7::int[], $8::bool[], $9::bigint[], $10::bigint[], $11::bigint[], \
     $12::float8[], $13::bigint[], $14::bigint[], $15::text[], $16::bool[], $17::int[], \
     $18::text[], $19::text[], $20::bigint[], $21::bigint[], $22::bigint[]) \
     ON CONFLICT (request_id) DO NOTHING RETURNING request_id";

const SPEND: &str = "INSERT INTO spend (key_id, spend, last_used_ms) \
     SELECT * FROM unnest($1::text[], $2::float8[], $3::bigint[]) \
     ON CONFLICT (key_id) DO UPDATE SET spend = spend.spend + excluded.spend, \
     last_used_ms = GREATEST(spend.last_used_ms, excluded.last_used_ms)";

/// The stored histogram and the batch's are added bin by bin (the shorter padded with NULL).
const ROLLUP: &str = "INSERT INTO usage_rollup (key_id, bucket_ms, model, status, requests, \
     prompt_tokens, completion_tokens, total_tokens, cost, latency_ms, estimated, latency) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
     ON CONFLICT (key_id, bucket_ms, model, status) DO UPDATE SET \
     requests = usage_rollup.requests + excluded.requests, \
     prompt_tokens = usage_rollup.prompt_tokens + excluded.prompt_tokens, \
     completion_tokens = usage_rollup.completion_tokens + excluded.completion_tokens, \
     total_tokens = usage_rollup.total_tokens + excluded.total_tokens, \
     cost = usage_rollup.cost + excluded.cost, \
     latency_ms = usage_rollup.latency_ms + excluded.latency_ms, \
     estimated = usage_rollup.estimated + excluded.estimated, \
     latency = ARRAY(SELECT COALESCE(a, 0) + COALESCE(b, 0) \
         FROM unnest(usage_rollup.latency, excluded.latency) WITH ORDINALITY AS t(a, b, i) \
         ORDER BY i)";

/// Small enough that one DELETE never holds locks long enough to stall a batch.
const RETENTION_CHUNK: i64 = 5_000;

/// A histogram as a dense array: index = bin.
pub(super) fn dense(h: &Hist) -> Vec<i32> {
    let len = h.keys().next_back().map_or(0, |b| *b as usize + 1);
    let mut out = vec![0i32; len];
    for (bin, n) in h {
        if let Some(slot) = out.get_mut(*bin as usize) {
            *slot = i32::try_from(*n).unwrap_or(i32::MAX);
        }
    }
    out
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Postgres text cannot hold NUL; a model name a client sent with one keeps the rest.
fn text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        s.replace('\0', "\u{fffd}").into()
    } else {
        s.into()
    }
}

/// Errors worth retrying until the server answers again: a lost or refused connection, a
/// server shutting down or starting, out of resources, or a transaction that lost a race.
fn transient(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        None => true,
        Some(code) => {
            let c = code.code();
            c.starts_with("08")
                || c.starts_with("57")
                || c.starts_with("53")
                || *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
        }
    }
}

pub(in crate::store) struct PgWriter {
    config: Config,
    client: Option<Client>,
}

impl PgWriter {
    pub fn new(config: Config) -> PgWriter {
        PgWriter {
            config,
            client: None,
        }
    }

    fn client(&mut self) -> Result<&mut Client, WriteError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            let c = connect(&self.config).map_err(|msg| WriteError {
                msg,
                transient: true,
            })?;
            self.client = Some(c);
        }
        self.client.as_mut().ok_or_else(|| WriteError {
            msg: "usage store (postgres): no connection".into(),
            transient: true,
        })
    }

    fn fail(&mut self, what: &str, e: postgres::Error) -> WriteError {
        let transient = transient(&e);
        // A connection that saw an error is not trusted again: the next try opens a new one.
        self.client = None;
        WriteError {
            msg: pg_err(what, e),
            transient,
        }
    }
}

impl BatchWriter for PgWriter {
    fn insert_batch(&mut self, batch: &[UsageRecord]) -> Result<(), WriteError> {
        let client = self.client()?;
        match insert(client, batch) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail("writing a batch", e)),
        }
    }

    /// A spooled batch committed just before a crash is still in the spool at the next start:
    /// its records are looked up by their (unique) request ids, so the spend counted at start
    /// has them once. A lookup that fails counts them all (never less than was spent).
    fn not_stored(&mut self, batch: &[UsageRecord]) -> Vec<UsageRecord> {
        let Ok(client) = self.client() else {
            return batch.to_vec();
        };
        let ids: Vec<&str> = batch.iter().map(|r| r.request_id.as_str()).collect();
        match client.query(
            "SELECT request_id FROM usage WHERE request_id = ANY($1)",
            &[&ids],
        ) {
            Ok(rows) => {
                let stored: HashSet<String> =
                    rows.iter().filter_map(|row| row.try_get(0).ok()).collect();
                batch
                    .iter()
                    .filter(|r| !stored.contains(&r.request_id))
                    .cloned()
                    .collect()
            }
            Err(e) => {
                let e = self.fail("looking up spooled records", e);
                tracing::warn!("{}: their spend is counted in full", e.msg);
                batch.to_vec()
            }
        }
    }

    fn delete_expired(&mut self, cutoff_ms: i64) -> Result<bool, WriteError> {
        let client = self.client()?;
        let result = client
            .execute(
                "DELETE FROM usage WHERE ctid IN \
                 (SELECT ctid FROM usage WHERE time_ms < $1 LIMIT $2)",
                &[&cutoff_ms, &RETENTION_CHUNK],
            )
            .and_then(|n| {
                // Rollups of quarters wholly before the cutoff go with their rows.
                client
                    .execute(
                        "DELETE FROM usage_rollup WHERE bucket_ms < $1",
                        &[&rollup::bucket_of(cutoff_ms)],
                    )
                    .map(|_| n)
            });
        match result {
            Ok(n) => Ok(n >= RETENTION_CHUNK as u64),
            Err(e) => Err(self.fail("retention", e)),
        }
    }
}

fn insert(client: &mut Client, batch: &[UsageRecord]) -> Result<(), postgres::Error> {
    let mut tx = client.transaction()?;
    let col = |f: fn(&UsageRecord) -> String| batch.iter().map(f).collect::<Vec<_>>();
    let time_ms: Vec<i64> = batch.iter().map(|r| r.time_ms).collect();
    let request_id = col(|r| r.request_id.clone());
    let key_id = col(|r| text(&r.key_id).into_owned());
    let listener = col(|r| r.listener.clone());
    let endpoint = col(|r| r.endpoint.clone());
    let model = col(|r| text(&r.model).into_owned());
    let status: Vec<i32> = batch.iter().map(|r| i32::from(r.status)).collect();
    let stream: Vec<bool> = batch.iter().map(|r| r.stream).collect();
    let prompt: Vec<i64> = batch.iter().map(|r| int(r.prompt_tokens)).collect();
    let completion: Vec<i64> = batch.iter().map(|r| int(r.completion_tokens)).collect();
    let total: Vec<i64> = batch.iter().map(|r| int(r.total_tokens)).collect();
    let cost: Vec<f64> = batch.iter().map(|r| r.cost).collect();
    let latency: Vec<i64> = batch.iter().map(|r| int(r.latency_ms)).collect();
    let ttft: Vec<Option<i64>> = batch.iter().map(|r| r.ttft_ms.map(int)).collect();
    let upstream = col(|r| text(&r.upstream).into_owned());
    let estimated: Vec<bool> = batch.iter().map(|r| r.estimated).collect();
    let attempts: Vec<i32> = batch
        .iter()
        .map(|r| i32::try_from(r.attempts).unwrap_or(i32::MAX))
        .collect();
    let served = col(|r| text(&r.served_model).into_owned());
    let cut = col(|r| r.cut.clone());
    let cached: Vec<i64> = batch.iter().map(|r| int(r.cached_prompt_tokens)).collect();
    let written: Vec<i64> = batch.iter().map(|r| int(r.cache_write_tokens)).collect();
    let reasoning: Vec<i64> = batch.iter().map(|r| int(r.reasoning_tokens)).collect();
    let inserted = tx.query(
        INSERT,
        &[
            &time_ms,
            &request_id,
            &key_id,
            &listener,
            &endpoint,
            &model,
            &status,
            &stream,
            &prompt,
            &completion,
            &total,
            &cost,
            &latency,
            &ttft,
            &upstream,
            &estimated,
            &attempts,
            &served,
            &cut,
            &cached,
            &written,
            &reasoning,
        ],
    )?;
    // Rows already stored (a retry or a replay) count nowhere a second time.
    let kept: Vec<&UsageRecord> = if inserted.len() == batch.len() {
        batch.iter().collect()
    } else {
        let ids = inserted
            .iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<Result<HashSet<_>, _>>()?;
        batch
            .iter()
            .filter(|r| ids.contains(&r.request_id))
            .collect()
    };
    add_spend_and_rollups(&mut tx, &kept)?;
    tx.commit()
}

/// The spend and rollups of the rows a batch stored, in the batch's transaction.
fn add_spend_and_rollups(
    tx: &mut postgres::Transaction<'_>,
    kept: &[&UsageRecord],
) -> Result<(), postgres::Error> {
    let mut spend: BTreeMap<String, (f64, i64)> = BTreeMap::new();
    for r in kept {
        let s = spend
            .entry(text(&r.key_id).into_owned())
            .or_insert((0.0, i64::MIN));
        s.0 += r.cost;
        s.1 = s.1.max(r.time_ms);
    }
    if !spend.is_empty() {
        let keys: Vec<&String> = spend.keys().collect();
        let costs: Vec<f64> = spend.values().map(|v| v.0).collect();
        let last: Vec<i64> = spend.values().map(|v| v.1).collect();
        tx.execute(SPEND, &[&keys, &costs, &last])?;
    }
    let mut rows: Vec<_> = rollup::aggregate(kept.iter().copied())
        .into_iter()
        .collect();
    rows.sort_by(|a, b| {
        let ((ab, ak, am, ast), _) = a;
        let ((bb, bk, bm, bst), _) = b;
        (ak, ab, am, ast).cmp(&(bk, bb, bm, bst))
    });
    if !rows.is_empty() {
        let up = tx.prepare(ROLLUP)?;
        for ((bucket, key, model, status), (s, hist)) in rows {
            tx.execute(
                &up,
                &[
                    &text(key).as_ref(),
                    &bucket,
                    &text(model).as_ref(),
                    &i32::from(status),
                    &int(s.requests),
                    &int(s.prompt_tokens),
                    &int(s.completion_tokens),
                    &int(s.total_tokens),
                    &s.cost,
                    &int(s.latency_ms),
                    &int(s.estimated),
                    &dense(&hist),
                ],
            )?;
        }
    }
    Ok(())
}
