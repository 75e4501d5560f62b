//! Fleet benches (plain `main`, figures printed), against real servers: the Postgres writer's
//! throughput (200,000 records recorded then flushed, three runs) and the shared limiter's
//! admission latency with Redis on loopback (one request at a time, then 50 at once), beside
//! the local limiter's. `bash benches/fleet.sh` starts a throwaway Postgres and Redis and runs
//! this; by hand: `MODELGATE_BENCH_PG=postgres://… MODELGATE_BENCH_REDIS=redis://… cargo bench
//! --bench fleet`. Without those variables (as under `cargo test`) it says so and stops.
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

use std::sync::Arc;
use std::time::{Duration, Instant};

use modelgate::config::keys::{Key, KeyTable, sha256};
use modelgate::limit::rate::Limiter;
use modelgate::limit::shared::{OnDown, SharedLimits};
use modelgate::store::{Store, StoreOptions, UsageRecord};

fn record(run: u64, i: u64, time_ms: i64) -> UsageRecord {
    UsageRecord {
        time_ms,
        request_id: format!("req_{run:04x}{i:024x}"),
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
        attempts: 1,
        served_model: "gpt-4o-mini".into(),
        cut: String::new(),
        ..Default::default()
    }
}

fn postgres_writer(url: &str, n: u64) {
    let mut rates = Vec::new();
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for run in 0..3u64 {
        let store = Store::open_postgres(url, StoreOptions::default()).expect("open postgres");
        let records: Vec<UsageRecord> = (0..n)
            .map(|i| record(base + run, i, 1_700_000_000_000 + i as i64))
            .collect();
        let start = Instant::now();
        for r in records {
            store.record(r);
        }
        assert!(store.flush(Duration::from_secs(300)), "flush timed out");
        let took = start.elapsed();
        assert_eq!(store.stats().written, n);
        let rate = n as f64 / took.as_secs_f64();
        println!(
            "postgres writer run {run}: {n} records committed in {:.3} s = {rate:.0} records/s",
            took.as_secs_f64()
        );
        rates.push(rate);
        store.close();
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "postgres writer throughput (median of 3): {:.0} records/s (target >= 50,000)",
        rates[1]
    );
}

fn key() -> Arc<Key> {
    let t = KeyTable::parse(
        "bench",
        "[[keys]]\nid = 'bench'\nsecret = 'sk-bench-limiter-0001'\nrpm = 1000000000\n\
         tpm = 1000000000000\nmax_concurrent = 1000000\nbudget = 1000000000.0\n",
    )
    .expect("keys");
    t.get_by_hash(&sha256(b"sk-bench-limiter-0001"))
        .expect("key")
        .clone()
}

fn percentiles(mut us: Vec<f64>) -> String {
    us.sort_by(f64::total_cmp);
    let at = |p: f64| us[((us.len() as f64 * p) as usize).min(us.len() - 1)];
    format!(
        "p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs",
        at(0.5),
        at(0.99),
        at(0.999)
    )
}

fn limiter(url: &str, n: usize) {
    let key = key();
    let local = Limiter::default();
    let mut us = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (ok, _) = local.admit(&key, Instant::now());
        drop(ok);
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!("local limiter, one admission: {}", percentiles(us));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let shared = SharedLimits::start(
        url,
        OnDown::Deny,
        Duration::from_millis(500),
        std::sync::Arc::new(modelgate::ops::metrics::Metrics::new().expect("metrics")),
    )
    .expect("redis");
    rt.block_on(async {
        // Warm up (the first call loads the script).
        for i in 0..1_000 {
            let _ = shared.admit(&key, &format!("warm-{i}")).await;
        }
        let mut us = Vec::with_capacity(n);
        for i in 0..n {
            let t = Instant::now();
            let d = shared
                .admit(&key, &format!("one-{i}"))
                .await
                .expect("redis answered");
            us.push(t.elapsed().as_secs_f64() * 1e6);
            drop(d);
        }
        println!(
            "redis limiter, one admission at a time (rpm + tpm + concurrency + spend): {}",
            percentiles(us)
        );
        let tasks: Vec<_> = (0..50)
            .map(|t| {
                let shared = shared.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let mut us = Vec::with_capacity(n / 50);
                    for i in 0..n / 50 {
                        let s = Instant::now();
                        let d = shared
                            .admit(&key, &format!("many-{t}-{i}"))
                            .await
                            .expect("redis");
                        us.push(s.elapsed().as_secs_f64() * 1e6);
                        drop(d);
                    }
                    us
                })
            })
            .collect();
        let start = Instant::now();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("task"));
        }
        let rate = all.len() as f64 / start.elapsed().as_secs_f64();
        println!(
            "redis limiter, 50 admissions at once: {} ({rate:.0} admissions/s)",
            percentiles(all)
        );
    });
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let (pg, redis) = (
        std::env::var("MODELGATE_BENCH_PG").ok(),
        std::env::var("MODELGATE_BENCH_REDIS").ok(),
    );
    if pg.is_none() && redis.is_none() {
        println!(
            "fleet bench: set MODELGATE_BENCH_PG / MODELGATE_BENCH_REDIS (benches/fleet.sh does)"
        );
        return;
    }
    if let Some(url) = pg {
        postgres_writer(&url, if quick { 2_000 } else { 200_000 });
    }
    if let Some(url) = redis {
        limiter(&url, if quick { 500 } else { 20_000 });
    }
}
