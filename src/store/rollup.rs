//! Store stage, rollups: per 15-minute bucket × key × model × status, the sums a usage summary
//! needs (requests, tokens, cost, latency), and a latency histogram per bucket × key × model.
//! The writer keeps them in the same transaction as the rows they count, so they never
//! disagree. A summary reads rollups for the whole buckets of its range and raw rows only for
//! the partial buckets at its two edges (under 15 minutes each), so any range is exact and its
//! cost does not grow with the rows in it. 15 minutes divides every UTC offset in use
//! (+05:30, +05:45), so local hours and days are whole buckets. Each engine stores and reads
//! them in its own SQL (`sqlite/rollup.rs`, `postgres/`); the sums and the plan are here.

use std::collections::HashMap;

use super::record::UsageRecord;

pub const BUCKET_MS: i64 = 15 * 60 * 1000;

pub fn bucket_of(ms: i64) -> i64 {
    ms.div_euclid(BUCKET_MS) * BUCKET_MS
}

/// Latency histogram bins grow by 10%: bin 0 is 0 ms, bin b ≥ 1 holds [1.1^(b-1), 1.1^b) ms
/// (the last, 255, everything from about 8 months up). A percentile read back is within 5% of
/// the true one (and exact below 10 ms).
pub fn latency_bin(ms: u64) -> u32 {
    if ms == 0 {
        return 0;
    }
    (((ms as f64).ln() / 1.1f64.ln()).floor() as u32 + 1).min(255)
}

/// A latency histogram: bin → requests.
pub type Hist = std::collections::BTreeMap<u32, u64>;

pub(super) fn encode(h: &Hist) -> Vec<u8> {
    let mut out = Vec::with_capacity(h.len() * 5);
    for (bin, n) in h {
        out.push(u8::try_from(*bin).unwrap_or(u8::MAX));
        out.extend_from_slice(&u32::try_from(*n).unwrap_or(u32::MAX).to_le_bytes());
    }
    out
}

/// Adds an encoded histogram into `h`; a malformed tail is ignored.
pub(super) fn add_encoded(h: &mut Hist, bytes: &[u8]) {
    for pair in bytes.chunks_exact(5) {
        let n = u32::from_le_bytes([pair[1], pair[2], pair[3], pair[4]]);
        *h.entry(u32::from(pair[0])).or_default() += u64::from(n);
    }
}

/// The value a bin stands for: its geometric middle, in whole milliseconds.
pub fn bin_value(bin: u32) -> u64 {
    if bin == 0 {
        return 0;
    }
    1.1f64.powf(f64::from(bin) - 0.5).round() as u64
}

/// The nearest-rank percentile (`p` in 0..=1) of a histogram; None when empty.
pub fn percentile(hist: &Hist, p: f64) -> Option<u64> {
    let n: u64 = hist.values().sum();
    if n == 0 {
        return None;
    }
    let rank = ((p * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0;
    for (bin, count) in hist {
        seen += count;
        if seen >= rank {
            return Some(bin_value(*bin));
        }
    }
    None
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sums {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub cost: f64,
    pub latency_ms: u64,
    /// Requests whose tokens were estimated.
    pub estimated: u64,
}

impl Sums {
    pub fn add_record(&mut self, r: &UsageRecord) {
        self.requests += 1;
        self.prompt_tokens = self.prompt_tokens.saturating_add(r.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(r.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(r.total_tokens);
        self.cost += r.cost;
        self.latency_ms = self.latency_ms.saturating_add(r.latency_ms);
        self.estimated += u64::from(r.estimated);
    }

    pub fn add(&mut self, o: &Sums) {
        self.requests += o.requests;
        self.prompt_tokens = self.prompt_tokens.saturating_add(o.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(o.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(o.total_tokens);
        self.cost += o.cost;
        self.latency_ms = self.latency_ms.saturating_add(o.latency_ms);
        self.estimated += o.estimated;
    }
}

/// One rollup row: a 15-minute bucket's sums for one key, model and status.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupRow {
    pub bucket_ms: i64,
    pub key_id: String,
    pub model: String,
    pub status: u16,
    pub sums: Sums,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RollupQuery {
    /// None = every key (the console).
    pub key_id: Option<String>,
    /// Inclusive, unix milliseconds.
    pub start_ms: i64,
    /// Exclusive, unix milliseconds.
    pub end_ms: i64,
    pub model: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rollup {
    /// Ordered by bucket; the edge buckets hold only the part inside the range.
    pub rows: Vec<RollupRow>,
    /// model → latency histogram over the whole range.
    pub latency: HashMap<String, Hist>,
}

pub(super) fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) type RowKey<'a> = (i64, &'a str, &'a str, u16);

/// Sums `records` per rollup row, each with its latency histogram.
pub(super) fn aggregate<'a>(
    records: impl IntoIterator<Item = &'a UsageRecord>,
) -> foldhash::HashMap<RowKey<'a>, (Sums, Hist)> {
    let mut rows: foldhash::HashMap<RowKey<'_>, (Sums, Hist)> = Default::default();
    for r in records {
        let row = rows
            .entry((bucket_of(r.time_ms), &r.key_id, r.rollup_model(), r.status))
            .or_default();
        row.0.add_record(r);
        *row.1.entry(latency_bin(r.latency_ms)).or_default() += 1;
    }
    rows
}

/// How a range is read: its whole buckets from the rollups, the parts of buckets at its edges
/// from raw rows.
pub(super) struct Plan {
    /// `[from, to)` of whole buckets, if any.
    pub whole: Option<(i64, i64)>,
    /// Non-empty `[from, to)` stretches of raw rows, each under a bucket.
    pub edges: Vec<(i64, i64)>,
}

impl Plan {
    pub fn of(q: &RollupQuery) -> Plan {
        let mut plan = Plan {
            whole: None,
            edges: Vec::new(),
        };
        if q.start_ms >= q.end_ms {
            return plan;
        }
        let first_whole = bucket_of(q.start_ms.saturating_add(BUCKET_MS - 1));
        let last_whole = bucket_of(q.end_ms);
        if first_whole <= last_whole {
            plan.edges.push((q.start_ms, first_whole));
            plan.edges.push((last_whole, q.end_ms));
            plan.whole = Some((first_whole, last_whole));
        } else {
            plan.edges.push((q.start_ms, q.end_ms));
        }
        plan.edges.retain(|(from, to)| from < to);
        plan
    }
}

/// Adds one stored rollup row (its histogram already decoded into `hist`) to `out`.
pub(super) fn push_row(out: &mut Rollup, row: RollupRow, hist: &Hist) {
    let into = out.latency.entry(row.model.clone()).or_default();
    for (bin, n) in hist {
        *into.entry(*bin).or_default() += n;
    }
    out.rows.push(row);
}

/// Adds raw records (a partial bucket at an edge) to `out`, summed as the rollups are.
pub(super) fn push_records(out: &mut Rollup, records: &[UsageRecord]) {
    for ((bucket_ms, key, model, status), (sums, hist)) in aggregate(records) {
        let row = RollupRow {
            bucket_ms,
            key_id: key.to_string(),
            model: model.to_string(),
            status,
            sums,
        };
        push_row(out, row, &hist);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::sqlite::sample_record;
    use crate::store::{Store, StoreOptions};

    /// Made-up model names share one row, refused before any try or by the upstream (an id
    /// a glob sent on); a served model keeps its name.
    #[test]
    fn models_the_gateway_does_not_serve_share_one_row() {
        let mut records = Vec::new();
        for (model, status, attempts) in [
            ("made-up-1", 404, 0),
            ("made-up-2", 404, 0),
            ("echo-1", 404, 1),
            ("echo-1", 200, 1),
            ("", 404, 0),
        ] {
            let mut r = sample_record(1, "k", 0);
            r.model = model.into();
            r.status = status;
            r.attempts = attempts;
            records.push(r);
        }
        let rows = aggregate(&records);
        let mut models: Vec<(&str, u16, u64)> = rows
            .iter()
            .map(|((_, _, model, status), (sums, _))| (*model, *status, sums.requests))
            .collect();
        models.sort_unstable();
        assert_eq!(
            models,
            [("", 404, 1), ("(unknown)", 404, 3), ("echo-1", 200, 1)]
        );
    }

    #[test]
    fn latency_bins_are_exact_below_ten_ms_and_within_five_percent_above() {
        for ms in 0..10u64 {
            assert_eq!(bin_value(latency_bin(ms)), ms, "{ms}");
        }
        for ms in [10u64, 37, 100, 999, 12_345, 3_600_000] {
            let back = bin_value(latency_bin(ms)) as f64;
            assert!(
                (back - ms as f64).abs() <= ms as f64 * 0.05 + 0.5,
                "{ms} -> {back}"
            );
        }
        let mut bins = Hist::new();
        for ms in 1..=100u64 {
            *bins.entry(latency_bin(ms)).or_default() += 1;
        }
        let p50 = percentile(&bins, 0.5).unwrap();
        assert!((48..=52).contains(&p50), "{p50}");
        let p95 = percentile(&bins, 0.95).unwrap();
        assert!((91..=99).contains(&p95), "{p95}");
        assert_eq!(percentile(&Hist::new(), 0.5), None);
        let mut h = Hist::new();
        h.insert(3, 7);
        h.insert(200, 1);
        let mut back = Hist::new();
        add_encoded(&mut back, &encode(&h));
        add_encoded(&mut back, &encode(&h));
        assert_eq!(back, Hist::from([(3, 14), (200, 2)]));
    }

    /// Any range read from rollups equals the sums of its raw rows, edges included.
    #[test]
    fn a_rollup_equals_the_raw_rows_for_any_range() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("u.db"), StoreOptions::default()).unwrap();
        let base = 1_795_305_600_000; // a bucket boundary
        let records: Vec<UsageRecord> = (0..3_000)
            .map(|i| sample_record(i, ["a", "b"][i as usize % 2], base + i as i64 * 37_003))
            .collect();
        for r in &records {
            store.record(r.clone());
        }
        assert!(store.flush(Duration::from_secs(30)));
        let span = 3_000 * 37_003;
        for (start, end) in [
            (base, base + span),
            (base + 1, base + span - 1),
            (base + 100_000, base + 200_000),
            (base + BUCKET_MS, base + 3 * BUCKET_MS),
            (base - BUCKET_MS, base + 7 * BUCKET_MS + 5),
        ] {
            let q = RollupQuery {
                key_id: Some("a".into()),
                start_ms: start,
                end_ms: end,
                model: None,
            };
            let got = store.rollup(&q).unwrap();
            let mut want = Sums::default();
            let mut got_sums = Sums::default();
            for r in records
                .iter()
                .filter(|r| r.key_id == "a" && r.time_ms >= start && r.time_ms < end)
            {
                want.add_record(r);
            }
            for row in &got.rows {
                got_sums.add(&row.sums);
            }
            assert_eq!(got_sums.requests, want.requests, "{start}..{end}");
            assert_eq!(got_sums.total_tokens, want.total_tokens);
            assert!((got_sums.cost - want.cost).abs() < 1e-9);
            let hist: u64 = got.latency.values().flat_map(|h| h.values()).sum();
            assert_eq!(hist, want.requests);
            assert!(
                got.rows
                    .windows(2)
                    .all(|w| w[0].bucket_ms <= w[1].bucket_ms)
            );
        }
    }

    #[test]
    fn rollups_are_built_once_for_a_database_that_predates_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.db");
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        for i in 0..100 {
            store.record(sample_record(i, "k", 1_000 + i as i64 * 60_000));
        }
        store.close();
        drop(store);
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("DELETE FROM usage_rollup;").unwrap();
        drop(conn);
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        let q = RollupQuery {
            key_id: Some("k".into()),
            start_ms: BUCKET_MS,
            end_ms: 90 * BUCKET_MS,
            model: None,
        };
        let n: u64 = store
            .rollup(&q)
            .unwrap()
            .rows
            .iter()
            .map(|r| r.sums.requests)
            .sum();
        let raw = (0..100).filter(|i| 1_000 + i * 60_000 >= BUCKET_MS).count() as u64;
        assert_eq!(n, raw);
    }
}
