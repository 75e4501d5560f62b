//! Usage store benches (plain `main`, figures printed): writer throughput (200,000 records
//! recorded then flushed), CSV export of 1,000,000 rows with resident memory sampled to show
//! it stays flat, and the crash journal's cost a request (its two lines, on one proxy thread
//! with 50 requests at a time). Run: `cargo bench --bench store` (under `cargo test`, a run 100
//! times smaller).

use std::time::{Duration, Instant};

use modelgate::store::{Query, Store, StoreOptions, UsageRecord};

fn record(i: u64, time_ms: i64) -> UsageRecord {
    UsageRecord {
        time_ms,
        request_id: format!("req_{i:016x}{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        key_id: format!("key-{:03}", i % 100),
        listener: "main".into(),
        endpoint: "chat".into(),
        model: "gpt-4o-mini".into(),
        status: 200,
        stream: i % 2 == 0,
        prompt_tokens: 100 + i % 900,
        completion_tokens: 20 + i % 400,
        total_tokens: 120 + i % 900 + i % 400,
        cost: (i % 1000) as f64 * 0.000_125,
        latency_ms: 200 + i % 3000,
        ttft_ms: (i % 2 == 0).then_some(80 + i % 200),
        upstream: "https://api.example.com/v1".into(),
        estimated: i % 10 == 0,
        attempts: 1 + (i % 3 == 0) as u32,
        served_model: "gpt-4o-mini".into(),
        cut: String::new(),
        ..Default::default()
    }
}

/// `VmRSS` or `VmHWM` of this process in KiB (0 where /proc is missing).
fn proc_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn writer_throughput(n: u64) {
    let mut rates = Vec::new();
    for run in 0..3 {
        let dir = tempfile::tempdir().expect("tempdir");
        let store =
            Store::open(&dir.path().join("usage.db"), StoreOptions::default()).expect("open");
        let records: Vec<UsageRecord> = (0..n)
            .map(|i| record(i, 1_700_000_000_000 + i as i64))
            .collect();
        let start = Instant::now();
        for r in records {
            store.record(r);
        }
        let sent = start.elapsed();
        assert!(store.flush(Duration::from_secs(120)), "flush timed out");
        let took = start.elapsed();
        let stats = store.stats();
        assert_eq!(stats.written, n);
        let rate = n as f64 / took.as_secs_f64();
        println!(
            "writer run {run}: {n} records committed in {:.3} s = {:.0} records/s \
             (record() calls took {:.1} ms, {:.0} ns each; overflowed {}, dropped {})",
            took.as_secs_f64(),
            rate,
            sent.as_secs_f64() * 1e3,
            sent.as_nanos() as f64 / n as f64,
            stats.overflowed,
            stats.dropped
        );
        rates.push(rate);
        store.close();
    }
    rates.sort_by(f64::total_cmp);
    println!("writer throughput (median of 3): {:.0} records/s", rates[1]);
}

fn export(rows: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("usage.db");
    let store = Store::open(&path, StoreOptions::default()).expect("open");
    let fill = Instant::now();
    let step = 50_000;
    for chunk in 0..rows.div_ceil(step) {
        for i in chunk * step..((chunk + 1) * step).min(rows) {
            store.record(record(i, 1_700_000_000_000 + i as i64 * 10));
        }
        // Keep the fill out of the overflow queue so the memory figures below are the export's.
        assert!(store.flush(Duration::from_secs(120)));
    }
    println!(
        "export: filled {rows} rows in {:.1} s; db {} MiB",
        fill.elapsed().as_secs_f64(),
        std::fs::metadata(&path).map_or(0, |m| m.len()) >> 20
    );

    let q = Query {
        key_id: None,
        start_ms: 0,
        end_ms: i64::MAX,
        limit: 0,
        ..Query::default()
    };
    for run in 0..2 {
        // Reset the peak so VmHWM below is this export's own (Linux ≥ 4.0).
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let rss_before = proc_kib("VmRSS:");
        let mut bytes = 0u64;
        let mut chunks = 0u64;
        let mut largest = 0usize;
        let mut rss_max = rss_before;
        let mut rss_at_10pct = 0;
        let start = Instant::now();
        let written = store
            .export_csv(&q, &mut |b| {
                bytes += b.len() as u64;
                largest = largest.max(b.len());
                chunks += 1;
                if chunks % 32 == 0 {
                    let rss = proc_kib("VmRSS:");
                    rss_max = rss_max.max(rss);
                    if rss_at_10pct == 0 && bytes > 15 << 20 {
                        rss_at_10pct = rss;
                    }
                }
                true
            })
            .expect("export");
        let took = start.elapsed();
        assert_eq!(written, rows);
        let rss_after = proc_kib("VmRSS:");
        let hwm = proc_kib("VmHWM:");
        println!(
            "export run {run}: {written} rows, {} MiB in {chunks} chunks (largest {largest} B) \
             in {:.3} s = {:.0} rows/s, {:.0} MiB/s",
            bytes >> 20,
            took.as_secs_f64(),
            written as f64 / took.as_secs_f64(),
            bytes as f64 / took.as_secs_f64() / 1_048_576.0
        );
        println!(
            "export run {run}: RSS before {rss_before} KiB, after ~15 MiB out {rss_at_10pct} KiB, \
             max sampled {rss_max} KiB, after {rss_after} KiB; growth {} KiB{}",
            rss_max.saturating_sub(rss_before),
            if reset {
                format!(
                    ", peak (VmHWM) growth {} KiB",
                    hwm.saturating_sub(rss_before)
                )
            } else {
                String::new()
            }
        );
    }
    store.close();
}

/// The journal's work for `n` requests, 50 at a time on one thread as on a proxy thread under
/// load: each opens its entry and waits for it, then writes its record and waits for that; the
/// time a request (less that of the same tasks doing nothing but yield once), and the lines a
/// `pwrite(2)`.
fn journal(n: u64) {
    use modelgate::store::journal::{Journal, OpenedRef, SentRef};
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path()).expect("journal");
    // As a proxy thread's: Pingora's work-stealing runtime, one worker.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let records: Vec<UsageRecord> = (0..50).map(|i| record(i, 1_764_000_000_000)).collect();
    let run = |n: u64, journaled: bool| {
        let started = Instant::now();
        rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..50u64 {
                let journal = std::sync::Arc::clone(&journal);
                let r = records[i as usize].clone();
                set.spawn(async move {
                    for _ in 0..n / 50 {
                        if !journaled {
                            tokio::task::yield_now().await;
                            continue;
                        }
                        let opened = OpenedRef {
                            time_ms: r.time_ms,
                            request_id: &r.request_id,
                            key_id: &r.key_id,
                            listener: &r.listener,
                            endpoint: &r.endpoint,
                            // Opened as the request goes upstream: with what it sends.
                            sent: Some(SentRef {
                                model: &r.model,
                                stream: r.stream,
                                prompt_tokens: r.prompt_tokens,
                                cost: r.cost,
                            }),
                        };
                        let Some(mut entry) = journal.open_entry(opened) else {
                            return;
                        };
                        entry.durable().await;
                        tokio::task::yield_now().await;
                        entry.preclose(&r.borrowed()).await;
                    }
                });
            }
            while set.join_next().await.is_some() {}
        });
        started.elapsed()
    };
    let writes = || journal.writes.load(std::sync::atomic::Ordering::Relaxed);
    run(n / 10, true);
    let before = writes();
    let took = run(n, true);
    let written = writes() - before;
    let alone = run(n, false);
    // A record's line, encoded as the journal does and by `serde_json` (its reference).
    let time = |encode: &dyn Fn(&mut Vec<u8>, &UsageRecord)| {
        let mut out = Vec::new();
        let t = Instant::now();
        for r in records.iter().cycle().take(n as usize) {
            out.clear();
            encode(&mut out, r);
        }
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    };
    let by_hand = time(&|out, r| modelgate::store::line::close(out, &r.borrowed()));
    let serde = time(&|out, r| serde_json::to_writer(out, r).expect("json"));
    println!(
        "journal: {n} requests, 50 at a time on one thread: {:.2} µs a request, {:.1} lines a \
         pwrite; a record's line takes {by_hand:.2} µs to encode ({serde:.2} µs by serde_json)",
        took.saturating_sub(alone).as_secs_f64() * 1e6 / n as f64,
        (2 * n) as f64 / written.max(1) as f64,
    );
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is taken as a filter.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    // Under `cargo test` (no `--bench`) a small smoke run, so the test suite stays quick.
    let scale = if std::env::args().any(|a| a == "--bench") {
        1
    } else {
        100
    };
    if wants("writer") {
        writer_throughput(200_000 / scale);
    }
    if wants("journal") {
        journal(500_000 / scale);
    }
    if wants("export") {
        export(1_000_000 / scale);
    }
}
