//! The usage writer's tests: batching, the overflow queue, memory given back, spend kept.
#![allow(clippy::unwrap_used)]
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::store::sqlite::sample_record;
use crate::store::{Query, Store, StoreOptions, StoreStats, UsageRecord};

fn rows(path: &Path) -> Vec<UsageRecord> {
    let store = Store::open(path, StoreOptions::default()).unwrap();
    let mut q = Query {
        key_id: None,
        start_ms: i64::MIN,
        end_ms: i64::MAX,
        limit: 10_000,
        ..Query::default()
    };
    let mut out = Vec::new();
    loop {
        let page = store.query(&q).unwrap();
        out.extend(page.records);
        match page.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => return out,
        }
    }
}

#[test]
fn a_lone_record_is_committed_within_the_batch_interval() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("u.db"), StoreOptions::default()).unwrap();
    let start = Instant::now();
    store.record(sample_record(1, "k", 1));
    while store.stats().written == 0 {
        assert!(start.elapsed() < Duration::from_secs(2), "not committed");
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(90),
        "{took:?}: committed before the interval"
    );
    assert!(took < Duration::from_millis(750), "{took:?}");
    assert_eq!(
        store.stats(),
        StoreStats {
            written: 1,
            ..StoreStats::default()
        }
    );
}

/// After a burst the idle writer gives its page cache back, once per burst, and the
/// records written before and after are all there.
#[test]
fn an_idle_writer_gives_its_memory_back_once_per_burst() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("u.db"), StoreOptions::default()).unwrap();
    let released = |n: u64| {
        let start = Instant::now();
        while store.memory_releases() < n {
            assert!(start.elapsed() < Duration::from_secs(10), "not released");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    for round in 0..2u64 {
        for i in 0..5_000 {
            store.record(sample_record(round * 5_000 + i, "k", i as i64));
        }
        assert!(store.flush(Duration::from_secs(10)));
        released(round + 1);
    }
    // Idle without new records: nothing more to give back.
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(store.memory_releases(), 2);
    assert_eq!(store.stats().written, 10_000);
}

#[test]
fn close_drains_a_burst_sent_right_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.db");
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    for i in 0..100_000 {
        store.record(sample_record(i, "k", i as i64));
    }
    store.close();
    store.close();
    let stats = store.stats();
    assert_eq!(
        (stats.written, stats.dropped, stats.queued),
        (100_000, 0, 0)
    );
    // After close: counted, not queued.
    store.record(sample_record(0, "k", 0));
    assert_eq!(store.stats().dropped, 1);
    assert!(store.flush(Duration::from_secs(1)));
    drop(store);
    let back = rows(&path);
    assert_eq!(back.len(), 100_000);
    assert!(
        back.iter()
            .enumerate()
            .all(|(i, r)| r.request_id == format!("req_{i}"))
    );
}

#[test]
fn a_full_channel_spills_to_the_overflow_queue_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.db");
    let opts = StoreOptions {
        channel_capacity: 1,
        batch_max: 64,
        ..StoreOptions::default()
    };
    let store = Store::open(&path, opts).unwrap();
    store.shared.paused.store(true, Ordering::SeqCst);
    for i in 0..20_000 {
        store.record(sample_record(i, "k", i as i64));
    }
    let stats = store.stats();
    assert!(stats.overflowed >= 19_000, "{stats:?}");
    assert_eq!(stats.dropped, 0);
    assert!(
        !store.flush(Duration::from_millis(20)),
        "paused writer cannot flush"
    );
    store.shared.paused.store(false, Ordering::SeqCst);
    assert!(store.flush(Duration::from_secs(30)));
    assert_eq!(store.stats().written, 20_000);
    // Keep going through a cramped channel with the writer running.
    for i in 20_000..60_000 {
        store.record(sample_record(i, "k", i as i64));
    }
    store.close();
    assert_eq!(store.stats().dropped, 0);
    drop(store);
    let back = rows(&path);
    assert_eq!(back.len(), 60_000);
    let mut ids: Vec<u64> = back
        .iter()
        .map(|r| r.request_id["req_".len()..].parse().unwrap())
        .collect();
    ids.sort_unstable();
    assert!(ids.iter().enumerate().all(|(i, &id)| id == i as u64));
}

/// `on_store_full = "serve"`: past the memory bound records are dropped and counted.
#[test]
fn past_the_overflow_bound_records_are_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.db");
    let opts = StoreOptions {
        channel_capacity: 10,
        overflow_max: 100,
        refuse_when_full: false,
        ..StoreOptions::default()
    };
    let store = Store::open(&path, opts).unwrap();
    store.shared.paused.store(true, Ordering::SeqCst);
    for i in 0..1_000 {
        store.record(sample_record(i, "k", i as i64));
    }
    let stats = store.stats();
    assert!(stats.dropped >= 880 && stats.dropped < 900, "{stats:?}");
    assert_eq!(stats.overflowed, 100);
    assert_eq!(stats.queued + stats.written + stats.dropped, 1_000);
    store.shared.paused.store(false, Ordering::SeqCst);
    store.close();
    let stats = store.stats();
    drop(store);
    assert_eq!(rows(&path).len() as u64, stats.written);
    assert_eq!(stats.written + stats.dropped, 1_000);
}

#[test]
fn spend_survives_reopen_and_is_not_lowered_by_retention() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.db");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    for i in 0..1_000 {
        // Half the rows are a year old.
        let t = if i % 2 == 0 {
            now - 365 * 86_400_000
        } else {
            now
        };
        let mut r = sample_record(i, ["a", "b"][i as usize % 4 / 2], t);
        r.cost = 0.25;
        store.record(r);
    }
    store.close();
    drop(store);

    let opts = StoreOptions {
        retention: Some(Duration::from_secs(86_400)),
        ..StoreOptions::default()
    };
    let store = Store::open(&path, opts).unwrap();
    assert!(store.flush(Duration::from_secs(10)));
    let spend = store.spend_totals().unwrap();
    assert_eq!(spend.len(), 2);
    assert_eq!(spend["a"], 125.0);
    assert_eq!(spend["b"], 125.0);
    store.record(sample_record(9, "a", now));
    store.close();
    drop(store);
    let left = rows(&path);
    assert_eq!(left.len(), 501, "the year-old rows are gone");
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    let q = crate::store::rollup::RollupQuery {
        key_id: None,
        start_ms: 0,
        end_ms: now + 1,
        model: None,
    };
    let counted: u64 = store
        .rollup(&q)
        .unwrap()
        .rows
        .iter()
        .map(|r| r.sums.requests)
        .sum();
    assert_eq!(counted, 501, "and so are their rollups");
    drop(store);
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    let spend = store.spend_totals().unwrap();
    assert_eq!(spend["a"], 125.0 + 0.125);
    assert_eq!(spend["b"], 125.0);
}

/// `on_store_full = "refuse"`: past the memory bound the store says it is full (new requests
/// are refused) and every record already made is kept.
#[test]
fn past_the_memory_bound_a_refusing_store_is_full_and_drops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.db");
    let opts = StoreOptions {
        channel_capacity: 10,
        overflow_max: 100,
        ..StoreOptions::default()
    };
    let store = Store::open(&path, opts).unwrap();
    store.shared.paused.store(true, Ordering::SeqCst);
    for i in 0..99 {
        store.record(sample_record(i, "k", i as i64));
    }
    assert!(!store.full() && !store.refuses());
    for i in 99..1_000 {
        store.record(sample_record(i, "k", i as i64));
    }
    assert!(store.full() && store.refuses());
    assert_eq!(store.stats().refused, 1);
    assert_eq!(store.stats().dropped, 0);
    store.shared.paused.store(false, Ordering::SeqCst);
    store.close();
    let stats = store.stats();
    drop(store);
    assert_eq!((stats.written, stats.dropped), (1_000, 0));
    assert_eq!(rows(&path).len(), 1_000);
}
