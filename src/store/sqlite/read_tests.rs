//! The usage queries' tests: filters, keyset paging, the CSV stream.
#![allow(clippy::unwrap_used)]
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::store::record::{CSV_HEADER, UsageRecord};
use crate::store::sqlite::sample_record;
use crate::store::{Store, StoreOptions};

fn all(key: Option<&str>, start_ms: i64, end_ms: i64, limit: usize) -> Query {
    Query {
        key_id: key.map(String::from),
        start_ms,
        end_ms,
        limit,
        ..Query::default()
    }
}

/// A read-only connection on `store_with`'s file.
fn with_reader<T>(
    dir: &tempfile::TempDir,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    f(&crate::store::sqlite::open_reader(&dir.path().join("u.db")).unwrap())
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

/// The CSV an export of exactly these records is.
fn csv_of(records: &[&UsageRecord]) -> Vec<u8> {
    let mut out = format!("{CSV_HEADER}\n").into_bytes();
    for r in records {
        r.write_csv(&mut out);
    }
    out
}

/// A whole export: the rows it counted and its bytes.
fn export_whole(store: &Store, q: &Query) -> (u64, Vec<u8>) {
    let mut got = Vec::new();
    let rows = store
        .export_csv(q, &mut |b| {
            got.extend_from_slice(&b);
            true
        })
        .unwrap();
    (rows, got)
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
        Cursor { time_ms: 0, seq: 0 },
        Cursor {
            time_ms: -5,
            seq: i64::MAX,
        },
        Cursor {
            time_ms: 1_795_353_265_123,
            seq: 42,
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
    // Many rows share a millisecond, so the seq tie-break matters.
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
    q.cursor = Some(Cursor { time_ms: 0, seq: 0 });
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
    let mut expected = format!("{CSV_HEADER}\n").into_bytes();
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
    assert!(got == expected);

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
    assert!(expected.starts_with(&first));
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
fn an_every_key_export_merges_the_keys_in_time_order_both_ways_and_past_the_merge_limit() {
    for keys in [3, MERGE_MAX_KEYS + 1] {
        // Several pages of rows; keys interleave and share milliseconds.
        let records: Vec<UsageRecord> = (0..9_000)
            .map(|i| sample_record(i, &format!("k{}", (i * 7) % keys as u64), i as i64 / 5))
            .collect();
        let (dir, store) = store_with(&records);
        let merged = with_reader(&dir, keys_to_merge).unwrap();
        assert_eq!(merged.is_some(), keys <= MERGE_MAX_KEYS, "{keys}");
        for (desc, model) in [
            (false, None),
            (true, None),
            (false, Some(&records[1].model)),
        ] {
            let mut q = all(None, 100, 1_700, 1);
            q.desc = desc;
            q.model = model.cloned();
            let mut want: Vec<&UsageRecord> = records
                .iter()
                .filter(|r| r.time_ms >= 100 && r.time_ms < 1_700)
                .filter(|r| model.is_none_or(|m| &r.model == m))
                .collect();
            if desc {
                want.reverse();
            }
            let (rows, got) = export_whole(&store, &q);
            assert_eq!(rows as usize, want.len(), "{keys} {desc}");
            assert!(got == csv_of(&want), "{keys} {desc} {model:?}");
        }
    }
}

#[test]
fn a_long_range_is_exported_in_slices_side_by_side_with_the_same_bytes() {
    // Ten hours, rows bunched at the start (a slice of its own holds most of them), three
    // keys sharing milliseconds.
    let records: Vec<UsageRecord> = (0..12_000u64)
        .map(|i| {
            let t = if i < 8_000 {
                i as i64
            } else {
                i as i64 * 3_000
            };
            sample_record(i, ["a", "b", "c"][(i % 3) as usize], t)
        })
        .collect();
    let (dir, store) = store_with(&records);
    let hours = 10 * 3_600_000;
    let cursor_at = &records[5_000];
    let cursor = Cursor {
        time_ms: cursor_at.time_ms,
        seq: with_reader(&dir, |c| {
            c.query_row(
                "SELECT seq FROM usage WHERE request_id = ?1",
                [&cursor_at.request_id],
                |r| r.get(0),
            )
            .map_err(StoreError::query)
        })
        .unwrap(),
    };
    for (key, desc, status, with_cursor) in [
        (None, false, None, false),
        (None, true, None, false),
        (Some("b"), false, None, false),
        (Some("c"), true, Some((200, 349)), false),
        (None, false, None, true),
        (None, true, None, true),
    ] {
        let mut q = all(key, 0, hours * 4, 1);
        q.desc = desc;
        q.status = status;
        q.cursor = with_cursor.then_some(cursor);
        let cut = with_reader(&dir, |c| slices(c, &q)).unwrap();
        assert!(cut.len() > 8, "{}", cut.len());
        let mut want: Vec<&UsageRecord> = records
            .iter()
            .filter(|r| key.is_none_or(|k| r.key_id == k))
            .filter(|r| status.is_none_or(|(lo, hi)| (lo..=hi).contains(&r.status)))
            .collect();
        if desc {
            want.reverse();
        }
        if with_cursor {
            let at = want
                .iter()
                .position(|r| r.request_id == cursor_at.request_id);
            want.drain(..=at.unwrap());
        }
        let expected = csv_of(&want);
        let (rows, got) = export_whole(&store, &q);
        assert_eq!(rows as usize, want.len(), "{key:?} {desc}");
        assert!(got == expected, "{key:?} {desc} {status:?} {with_cursor}");

        // Stopping after two chunks stops every reader (the call returns) with the rows
        // handed over counted.
        let mut first = Vec::new();
        let mut calls = 0;
        let rows = store
            .export_csv(&q, &mut |b| {
                calls += 1;
                first.extend_from_slice(&b);
                calls < 2
            })
            .unwrap();
        assert_eq!(calls, 2);
        assert!(expected.starts_with(&first));
        let lines = first.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(rows as usize, lines - 1);
    }
    // A range with nothing in it is the header alone, and one slice.
    let q = all(None, hours * 5, hours * 6, 1);
    assert_eq!(with_reader(&dir, |c| slices(c, &q)).unwrap().len(), 1);
    let mut got = Vec::new();
    store
        .export_csv(&q, &mut |b| {
            got.extend_from_slice(&b);
            true
        })
        .unwrap();
    assert_eq!(got, format!("{CSV_HEADER}\n").as_bytes());
}

#[test]
fn newest_first_pages_walk_backwards_and_filters_hold() {
    let records: Vec<UsageRecord> = (0..500)
        .map(|i| sample_record(i, ["a", "b"][i as usize % 2], 1_000 + (i as i64 / 3)))
        .collect();
    let (_dir, store) = store_with(&records);
    let mut want: Vec<UsageRecord> = records
        .iter()
        .filter(|r| r.key_id == "a" && r.time_ms >= 1_010 && r.time_ms < 1_100)
        .cloned()
        .collect();
    want.reverse();
    for limit in [1, 7, 1_000] {
        let mut q = all(Some("a"), 1_010, 1_100, limit);
        q.desc = true;
        assert_eq!(every_page(&store, q), want, "{limit}");
    }
    let mut q = all(None, 0, i64::MAX, 50);
    q.model = Some(records[3].model.clone());
    q.status = Some((200, 299));
    let got = every_page(&store, q.clone());
    let expect: Vec<UsageRecord> = records
        .iter()
        .filter(|r| r.model == records[3].model && (200..300).contains(&r.status))
        .cloned()
        .collect();
    assert!(!expect.is_empty());
    assert_eq!(got, expect);
    let mut csv = Vec::new();
    q.desc = true;
    store
        .export_csv(&q, &mut |b| {
            csv.extend_from_slice(&b);
            true
        })
        .unwrap();
    let mut expected = format!("{CSV_HEADER}\n").into_bytes();
    for r in expect.iter().rev() {
        r.write_csv(&mut expected);
    }
    assert!(csv == expected);
}

#[test]
fn both_queries_walk_an_index_without_sorting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.db");
    let _store = Store::open(&path, StoreOptions::default()).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    for (keyed, desc, index) in [
        (true, false, "PRIMARY KEY"),
        (false, false, "usage_time"),
        (true, true, "PRIMARY KEY"),
        (false, true, "usage_time"),
    ] {
        let mut q = all(keyed.then_some("k"), 0, 10, 10);
        q.desc = desc;
        let (sql, args) = select(&q, (0, 0), 10);
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let mut rows = stmt.query(params_from_iter(args)).unwrap();
        let mut plan = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            plan.push(row.get::<_, String>(3).unwrap());
        }
        let plan = plan.join(" | ");
        assert!(plan.contains(index), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    }
}
