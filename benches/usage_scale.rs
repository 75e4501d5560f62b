//! The usage page's reads at scale (plain `main`, figures printed): a SQLite store of 10,000,000
//! records over 30 days (10 keys, 5 models), then
//! - a key's 30-day summary (rollups → local days in Asia/Kolkata), target < 100 ms;
//! - every key's 30-day summary (the console's view);
//! - the first table page, newest first, target < 50 ms (also filtered by model);
//! - a CSV export of one key's 1,000,000 rows, target ≥ 500k rows/s with flat memory.
//!
//! Run: `cargo bench --bench usage_scale` (the store is generated once into
//! `target/bench-usage-10m.db` and reused). Under `cargo test` it runs on 20,000 records as a
//! smoke check.

use std::time::{Duration, Instant};

use modelgate::store::rollup::RollupQuery;
use modelgate::store::{Query, Store, StoreOptions, UsageRecord};
use modelgate::web::summary;

const DAY_MS: i64 = 24 * 3600 * 1000;
const KEYS: u64 = 10;
const MODELS: [&str; 5] = [
    "gpt-4o-mini",
    "gpt-4o",
    "claude-sonnet",
    "llama-3-70b",
    "embed-3",
];

fn record(i: u64, time_ms: i64) -> UsageRecord {
    let status = match i % 50 {
        0 => 429,
        1 => 500,
        _ => 200,
    };
    UsageRecord {
        time_ms,
        request_id: format!("req_{i:016x}{:012x}", i.wrapping_mul(0x9E37_79B9)),
        key_id: format!("key-{:03}", i % KEYS),
        listener: if i % 3 == 0 { "direct" } else { "main" }.into(),
        endpoint: "chat".into(),
        model: MODELS[(i / KEYS) as usize % MODELS.len()].into(),
        status,
        stream: i % 2 == 0,
        prompt_tokens: 100 + i % 900,
        completion_tokens: 20 + i % 400,
        total_tokens: 120 + i % 900 + i % 400,
        cost: (i % 1000) as f64 * 0.000_125,
        latency_ms: 50 + (i * 7919) % 4000,
        ttft_ms: (i % 2 == 0).then_some(80 + i % 200),
        upstream: "https://api.example.com".into(),
        estimated: i % 10 == 0,
        attempts: 1,
        served_model: "gpt-4o".into(),
        cut: String::new(),
        ..Default::default()
    }
}

fn proc_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timed<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut times = Vec::new();
    let mut out = None;
    for _ in 0..runs {
        let t = Instant::now();
        out = Some(f());
        times.push(t.elapsed());
    }
    (median(times), out.expect("at least one run"))
}

/// A real run (`cargo bench`); under `cargo test` (a debug build, 20,000 rows) no timing is
/// judged against its target.
fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn verdict(took: Duration, target_ms: u128) -> &'static str {
    if !full() {
        "not judged in a smoke run"
    } else if took.as_millis() < target_ms {
        "within target"
    } else {
        "OVER TARGET"
    }
}

/// Exports `q` and prints rows/s and the growth of anonymous memory (heap): the readers map
/// the database file, so total RSS also counts file pages the kernel can drop at any time.
fn export(store: &Store, what: &str, q: &Query) {
    let anon_before = proc_kib("RssAnon:");
    let mut anon_max = anon_before;
    let t = Instant::now();
    let mut bytes = 0u64;
    let mut chunks = 0u64;
    let rows = store
        .export_csv(q, &mut |chunk| {
            bytes += chunk.len() as u64;
            chunks += 1;
            if chunks % 64 == 0 {
                anon_max = anon_max.max(proc_kib("RssAnon:"));
            }
            true
        })
        .expect("export");
    let took = t.elapsed();
    let rate = rows as f64 / took.as_secs_f64();
    println!(
        "CSV export, {what}: {rows} rows, {} MiB in {:.2} s = {:.0} rows/s (target 500k: {}); \
         heap (RssAnon) growth: peak sampled {} KiB, after {} KiB",
        bytes >> 20,
        took.as_secs_f64(),
        rate,
        if !full() {
            "not judged in a smoke run"
        } else if rate >= 500_000.0 {
            "met"
        } else {
            "MISSED"
        },
        anon_max.saturating_sub(anon_before),
        proc_kib("RssAnon:").saturating_sub(anon_before),
    );
}

fn exports(store: &Store, start_ms: i64, end_ms: i64) {
    // One key's million rows (its index walk visits every 10th row of the table), then a
    // million rows of every key (three days; a straight walk of the time index).
    let one_key = Query {
        key_id: Some("key-000".into()),
        start_ms,
        end_ms,
        ..Query::default()
    };
    export(store, "one key", &one_key);
    let three_days = start_ms + 3 * DAY_MS;
    let all_keys = Query {
        key_id: None,
        start_ms,
        end_ms: three_days.min(end_ms),
        ..Query::default()
    };
    export(store, "every key, 3 days", &all_keys);
}

fn main() {
    let full = full();
    // `cargo bench --bench usage_scale -- export` runs only the exports (for profiling).
    let only_export = std::env::args().skip(1).any(|a| a == "export");
    let n: u64 = if full { 10_000_000 } else { 20_000 };
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = if full {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-usage-10m.db")
    } else {
        tmp.path().join("usage.db")
    };
    let end_ms: i64 = 1_795_305_600_000; // 2026-11-22T00:00Z
    let start_ms = end_ms - 30 * DAY_MS;
    let step = (30 * DAY_MS) as f64 / n as f64;
    let store = Store::open(&path, StoreOptions::default()).expect("open");
    let have = store
        .rollup(&RollupQuery {
            key_id: None,
            start_ms,
            end_ms,
            model: None,
        })
        .expect("rollup")
        .rows
        .iter()
        .map(|r| r.sums.requests)
        .sum::<u64>();
    if have != n {
        assert_eq!(have, 0, "{} holds other data: delete it", path.display());
        let t = Instant::now();
        for i in 0..n {
            store.record(record(i, start_ms + (i as f64 * step) as i64));
            if i % 1_000_000 == 999_999 {
                assert!(store.flush(Duration::from_secs(600)));
                println!(
                    "fill: {} records, {:.0} s",
                    i + 1,
                    t.elapsed().as_secs_f64()
                );
            }
        }
        assert!(store.flush(Duration::from_secs(600)), "flush timed out");
        println!(
            "fill: {n} records in {:.1} s = {:.0} records/s (rows + rollups); db {} MiB",
            t.elapsed().as_secs_f64(),
            n as f64 / t.elapsed().as_secs_f64(),
            std::fs::metadata(&path).map_or(0, |m| m.len()) >> 20
        );
    }

    if only_export {
        return exports(&store, start_ms, end_ms);
    }
    // A key's 30 days, local days in Asia/Kolkata: exact edges from raw rows, the rest rollups.
    let q = format!(
        "start={}&end={}&tz=Asia/Kolkata&bucket=day",
        (start_ms + 12_345) / 1000,
        end_ms / 1000
    );
    let range = summary::parse_range(Some(&q), end_ms, false).expect("range");
    let (took, requests) = timed(7, || {
        let rollup = store
            .rollup(&RollupQuery {
                key_id: Some("key-000".into()),
                start_ms: range.start_ms,
                end_ms: range.end_ms,
                model: None,
            })
            .expect("rollup");
        let v = summary::compute(&rollup, &range).expect("summary");
        v["totals"]["requests"].as_u64().unwrap_or(0)
    });
    println!(
        "summary, one key, 30 days in IST days: {:.1} ms median of 7 ({requests} requests; target 100 ms: {})",
        took.as_secs_f64() * 1e3,
        verdict(took, 100)
    );
    let (took, requests) = timed(5, || {
        let rollup = store
            .rollup(&RollupQuery {
                key_id: None,
                start_ms: range.start_ms,
                end_ms: range.end_ms,
                model: None,
            })
            .expect("rollup");
        let v = summary::compute(&rollup, &range).expect("summary");
        v["totals"]["requests"].as_u64().unwrap_or(0)
    });
    println!(
        "summary, every key, 30 days: {:.1} ms median of 5 ({requests} requests)",
        took.as_secs_f64() * 1e3
    );

    for model in [None, Some("gpt-4o")] {
        let (took, rows) = timed(7, || {
            let page = store
                .query(&Query {
                    key_id: Some("key-000".into()),
                    start_ms,
                    end_ms,
                    limit: 50,
                    desc: true,
                    model: model.map(String::from),
                    ..Query::default()
                })
                .expect("page");
            page.records.len()
        });
        println!(
            "first page, newest first, 50 rows{}: {:.2} ms median of 7 ({rows} rows; target 50 ms: {})",
            model.map_or(String::new(), |m| format!(", model={m}")),
            took.as_secs_f64() * 1e3,
            verdict(took, 50)
        );
    }

    exports(&store, start_ms, end_ms);
    store.close();
}
