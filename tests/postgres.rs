//! The Postgres store (`[storage] postgres`), against a real Postgres server started by the
//! test: the same records, pages, CSV, rollups, spend and console tables as the SQLite store;
//! idempotent writes; two gateways sharing one database; Postgres killed and restarted under
//! load with no record lost or written twice; records spooled across a gateway restart.
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pg::Postgres;
use common::{KEY, OTHER_KEY, Setup, chat_body, request_id, send, start_with};
use modelgate::store::console::{AuditEntry, Session};
use modelgate::store::rollup::RollupQuery;
use modelgate::store::{Query, Store, StoreOptions, UsageRecord};

fn record(i: u64, key: &str, time_ms: i64) -> UsageRecord {
    UsageRecord {
        time_ms,
        request_id: format!("req_pg_{i}"),
        key_id: key.to_string(),
        listener: if i % 2 == 0 { "main" } else { "direct" }.into(),
        endpoint: "chat".into(),
        model: format!("model,\"{}\"", i % 7),
        status: [200, 200, 200, 429, 499, 502][(i % 6) as usize],
        stream: i % 3 == 0,
        prompt_tokens: i,
        completion_tokens: i * 2,
        total_tokens: i * 3,
        cost: (i % 8) as f64 * 0.125,
        latency_ms: (i * 37) % 20_000,
        ttft_ms: if i % 2 == 0 { None } else { Some(i % 900) },
        upstream: "http://127.0.0.1:9100".into(),
        estimated: i % 5 == 0,
        attempts: (i % 3) as u32 + 1,
        served_model: if i % 4 == 0 {
            String::new()
        } else {
            format!("served-{}", i % 3)
        },
        cut: if i % 6 == 1 { "client" } else { "" }.into(),
        cached_prompt_tokens: i / 2,
        cache_write_tokens: i % 3,
        reasoning_tokens: i % 4,
    }
}

fn csv(store: &Store, q: &Query) -> Vec<u8> {
    let mut out = Vec::new();
    store
        .export_csv(q, &mut |b| {
            out.extend_from_slice(&b);
            true
        })
        .expect("export");
    out
}

fn all_pages(store: &Store, mut q: Query) -> Vec<UsageRecord> {
    let mut out = Vec::new();
    loop {
        let page = store.query(&q).expect("page");
        out.extend(page.records);
        match page.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => return out,
        }
    }
}

fn sorted_rollup(store: &Store, q: &RollupQuery) -> modelgate::store::rollup::Rollup {
    let mut r = store.rollup(q).expect("rollup");
    r.rows.sort_by(|a, b| {
        (a.bucket_ms, &a.key_id, &a.model, a.status).cmp(&(
            b.bucket_ms,
            &b.key_id,
            &b.model,
            b.status,
        ))
    });
    r
}

/// Every read the usage API, the page and the console make gives the same answer from
/// Postgres as from SQLite for the same records written in the same order.
#[test]
fn postgres_answers_every_read_exactly_as_sqlite_does() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let lite = Store::open(&dir.path().join("u.db"), StoreOptions::default()).expect("sqlite");
    let post = Store::open_postgres(&pg.url(), StoreOptions::default()).expect("postgres");
    let base = 1_790_000_000_000i64;
    let records: Vec<_> = (0..12_000u64)
        .map(|i| {
            let key = ["a", "b", "c"][(i % 3) as usize];
            // Several rows share a millisecond, so the seq tie-break is exercised.
            record(i, key, base + (i as i64 / 3) * 1_000)
        })
        .collect();
    for r in &records {
        lite.record(r.clone());
        post.record(r.clone());
    }
    assert!(lite.flush(Duration::from_secs(60)) && post.flush(Duration::from_secs(60)));
    assert_eq!(post.stats().written, 12_000);
    let end = base + 4_000 * 1_000;
    for q in [
        Query {
            key_id: Some("a".into()),
            start_ms: base,
            end_ms: end,
            limit: 333,
            ..Query::default()
        },
        Query {
            key_id: None,
            start_ms: base + 7_777,
            end_ms: end - 12_345,
            limit: 1_000,
            ..Query::default()
        },
        Query {
            key_id: Some("b".into()),
            start_ms: base,
            end_ms: end,
            limit: 50,
            desc: true,
            ..Query::default()
        },
        Query {
            key_id: None,
            start_ms: base,
            end_ms: end,
            limit: 200,
            model: Some("model,\"3\"".into()),
            status: Some((400, 499)),
            ..Query::default()
        },
    ] {
        let from_lite = all_pages(&lite, q.clone());
        assert!(!from_lite.is_empty());
        assert_eq!(all_pages(&post, q.clone()), from_lite, "pages of {q:?}");
        let (a, b) = (csv(&lite, &q), csv(&post, &q));
        assert!(a.len() > 100);
        assert_eq!(
            String::from_utf8_lossy(&b),
            String::from_utf8_lossy(&a),
            "CSV of {q:?}"
        );
    }
    for q in [
        RollupQuery {
            key_id: Some("c".into()),
            start_ms: base + 61_000,
            end_ms: end - 1_000,
            model: None,
        },
        RollupQuery {
            key_id: None,
            start_ms: base,
            end_ms: end,
            model: Some("model,\"5\"".into()),
        },
    ] {
        assert_eq!(
            sorted_rollup(&post, &q),
            sorted_rollup(&lite, &q),
            "rollup of {q:?}"
        );
    }
    assert_eq!(
        post.spend_totals().expect("spend"),
        lite.spend_totals().expect("spend")
    );
    assert_eq!(
        post.last_used().expect("last"),
        lite.last_used().expect("last")
    );

    let s = Session {
        user: "admin".into(),
        csrf: "c".into(),
        created_ms: 1_000,
        expires_ms: 5_000,
        cred: "t".into(),
    };
    post.console.session_put("h", &s).expect("put");
    assert_eq!(post.console.session_get("h", 2_000).expect("get"), Some(s));
    assert_eq!(post.console.session_get("h", 5_000).expect("get"), None);
    post.console.session_delete("h").expect("delete");
    assert_eq!(post.console.session_get("h", 2_000).expect("get"), None);
    for i in 0..3 {
        let e = AuditEntry {
            time_ms: i,
            user: "admin".into(),
            action: "update".into(),
            key_id: format!("k{i}"),
            detail: "{}".into(),
        };
        post.console.audit_add(&e).expect("audit");
    }
    let list = post.console.audit_list(2).expect("list");
    assert_eq!(
        list.iter().map(|e| e.key_id.as_str()).collect::<Vec<_>>(),
        ["k2", "k1"]
    );
    post.close();
    lite.close();
}

/// A crash between a spooled batch's commit and the spool's note of it: at the next start its
/// records are both in Postgres and still in the spool, and the spend counted at start has
/// them once (it had them twice until the next start); the replay adds no row.
#[test]
fn spooled_records_already_in_postgres_count_once_at_start() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let spool = dir.path().join("usage-spool.jsonl");
    let base = 1_791_000_000_000i64;
    let recs: Vec<UsageRecord> = (0..10).map(|i| record(i, "k", base + i as i64)).collect();
    {
        let store = Store::open_postgres(&pg.url(), StoreOptions::default()).expect("postgres");
        for r in &recs[..6] {
            store.record(r.clone());
        }
        assert!(store.flush(Duration::from_secs(30)));
        store.close();
    }
    // The spool as the crash left it: all ten, the first six already committed.
    let lines: String = recs
        .iter()
        .map(|r| serde_json::to_string(r).expect("json") + "\n")
        .collect();
    std::fs::write(&spool, lines).expect("spool");
    let opts = StoreOptions {
        spool: Some(spool.clone()),
        ..StoreOptions::default()
    };
    let store = Store::open_postgres(&pg.url(), opts).expect("postgres");
    let spent = store.spend_at_open()["k"];
    let all: f64 = recs.iter().map(|r| r.cost).sum();
    assert!(
        (spent - all).abs() < 1e-9,
        "spend at start {spent}, spent {all}"
    );
    assert!(store.flush(Duration::from_secs(30)));
    common::eventually(
        Duration::from_secs(30),
        "the spool was not replayed",
        || {
            if spool.exists() {
                Err(String::new())
            } else {
                Ok(())
            }
        },
    );
    store.close();
}

/// A batch written again (a retry after a lost acknowledgement, a spool replayed) adds no row,
/// no spend and no rollup count; two stores (two gateways) writing at once to the same keys
/// and buckets add up exactly.
#[test]
fn writes_are_idempotent_on_request_id_and_concurrent_writers_add_up() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    let base = 1_790_000_000_000i64;
    let stores: Vec<Arc<Store>> = (0..2)
        .map(|_| {
            let opts = StoreOptions {
                batch_max: 64,
                ..StoreOptions::default()
            };
            Store::open_postgres(&pg.url(), opts).expect("postgres")
        })
        .collect();
    // Each store writes its own half, and both write the first 500 again.
    let threads: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(n, store)| {
            let store = Arc::clone(store);
            std::thread::spawn(move || {
                for i in 0..4_000u64 {
                    if i % 2 == n as u64 || i < 500 {
                        store.record(record(
                            i,
                            ["a", "b"][(i % 2) as usize],
                            base + i as i64 * 10,
                        ));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    for s in &stores {
        assert!(s.flush(Duration::from_secs(60)));
        assert_eq!(s.stats().write_errors, 0);
    }
    let mut c = pg.client();
    let n: i64 = c
        .query_one("SELECT COUNT(*) FROM usage", &[])
        .expect("count")
        .get(0);
    assert_eq!(n, 4_000);
    let dup: i64 = c
        .query_one(
            "SELECT COUNT(*) - COUNT(DISTINCT request_id) FROM usage",
            &[],
        )
        .expect("dups")
        .get(0);
    assert_eq!(dup, 0);
    let want: HashMap<String, f64> = (0..4_000u64).fold(HashMap::new(), |mut m, i| {
        *m.entry(["a", "b"][(i % 2) as usize].to_string())
            .or_default() += record(i, "", 0).cost;
        m
    });
    let got = stores[0].spend_totals().expect("spend");
    for (k, v) in &want {
        assert!((got[k] - v).abs() < 1e-9, "spend of {k}: {} vs {v}", got[k]);
    }
    let requests: i64 = c
        .query_one("SELECT SUM(requests)::bigint FROM usage_rollup", &[])
        .expect("rollup")
        .get(0);
    assert_eq!(requests, 4_000);
    let bins: i64 = c
        .query_one(
            "SELECT SUM(n)::bigint FROM usage_rollup, unnest(latency) AS n",
            &[],
        )
        .expect("hist")
        .get(0);
    assert_eq!(bins, 4_000, "every request in exactly one latency bin");
}

fn pg_config(pg: &Postgres) -> String {
    format!("\n[storage]\npostgres = \"{}\"\n", pg.url())
}

async fn request_ids(resp: Vec<reqwest::Response>) -> Vec<String> {
    resp.iter()
        .map(|r| {
            assert_eq!(r.status(), 200);
            request_id(r)
        })
        .collect()
}

/// Waits until Postgres holds exactly `ids` (no more, no fewer, none twice).
fn await_rows(pg: &Postgres, ids: &HashSet<String>, within: Duration) {
    common::pg::off_runtime(|| await_rows_here(pg, ids, within));
}

fn await_rows_here(pg: &Postgres, ids: &HashSet<String>, within: Duration) {
    let mut c = pg.client();
    common::eventually(within, "records missing in postgres", || {
        let rows = c.query("SELECT request_id FROM usage", &[]).expect("rows");
        let got: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let set: HashSet<String> = got.iter().cloned().collect();
        assert_eq!(set.len(), got.len(), "a record written twice");
        if &set == ids {
            return Ok(());
        }
        Err(format!(
            "{} of {} records in postgres; extra: {:?}",
            set.intersection(ids).count(),
            ids.len(),
            set.difference(ids).take(3).collect::<Vec<_>>()
        ))
    });
}

/// Two gateways on one database: each one's records in the other's usage API and CSV, and a
/// console session signed in on one holds on the other.
#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_share_records_and_console_sessions() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    let hash = {
        let out = std::process::Command::new(common::bin())
            .arg("password-hash")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().expect("stdin").write_all(b"pw-fleet-1\n")?;
                c.wait_with_output()
            })
            .expect("password-hash");
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_string()
    };
    let setup = || Setup {
        extra_config: format!(
            "{}\n[console]\nuser = \"admin\"\npassword_hash = \"{hash}\"\n",
            pg_config(&pg)
        ),
        ..Setup::default()
    };
    let a = start_with(setup());
    let b = start_with(setup());
    let mut ids = Vec::new();
    for (g, key) in [(&a, KEY), (&b, KEY), (&a, OTHER_KEY), (&b, KEY)] {
        let r = send(
            &g.direct,
            "/v1/chat/completions",
            Some(key),
            &chat_body("echo-1", false),
            &[],
        )
        .await;
        ids.extend(request_ids(vec![r]).await);
    }
    await_rows(&pg, &ids.iter().cloned().collect(), Duration::from_secs(10));
    for g in [&a, &b] {
        let csv = common::get(&g.direct, "/api/usage.csv", Some(KEY))
            .await
            .text()
            .await
            .expect("csv");
        for (i, id) in ids.iter().enumerate() {
            // The third request was the other key's: never in this key's export.
            assert_eq!(
                csv.contains(id.as_str()),
                i != 2,
                "{id} in the CSV of {}",
                g.direct
            );
        }
    }
    // Signed in on a, the session cookie works on b.
    let login = common::client()
        .post(format!("{}/console/login", a.main))
        .header("origin", &a.main)
        .json(&serde_json::json!({"user": "admin", "password": "pw-fleet-1"}))
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), 204);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .expect("pair")
        .to_string();
    let keys = common::client()
        .get(format!("{}/console/api/keys", b.main))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("keys");
    assert_eq!(keys.status(), 200, "a's session on b");
}

/// Postgres killed mid-load and started again: every request is answered, and every record
/// reaches the database exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_killed_and_restarted_under_load_loses_and_doubles_nothing() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    let g = start_with(Setup {
        extra_config: pg_config(&pg),
        ..Setup::default()
    });
    let spool = g.dir.path().join("usage-spool.jsonl");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load = |n: usize| {
        let base = g.direct.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..n {
                let stream = i % 3 == 0;
                let r = send(
                    &base,
                    "/v1/chat/completions",
                    Some(KEY),
                    &chat_body("echo-1", stream),
                    &[],
                )
                .await;
                assert_eq!(r.status(), 200);
                let id = request_id(&r);
                r.bytes().await.expect("body");
                ids.push(id);
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            ids
        })
    };
    let first: Vec<_> = (0..8).map(|_| load(40)).collect();
    // Kill it while that load runs (a quarter of it answered), then keep loading while it is
    // down.
    let deadline = Instant::now() + Duration::from_secs(10);
    while done.load(std::sync::atomic::Ordering::Relaxed) < 80 {
        assert!(Instant::now() < deadline, "the first load never got going");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pg.down();
    let during: Vec<_> = (0..8).map(|_| load(40)).collect();
    let mut ids = HashSet::new();
    for t in first.into_iter().chain(during) {
        ids.extend(t.await.expect("load"));
    }
    // Records wait in the spool on disk while the database is away.
    common::eventually_async(
        Duration::from_secs(10),
        "nothing spooled while postgres was down",
        async || {
            if spool.exists() {
                Ok(())
            } else {
                Err(String::new())
            }
        },
    )
    .await;
    pg.up();
    let after: Vec<_> = (0..4).map(|_| load(20)).collect();
    for t in after {
        ids.extend(t.await.expect("load"));
    }
    assert_eq!(ids.len(), 720);
    let all_in = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        await_rows(&pg, &ids, Duration::from_secs(30))
    }));
    if all_in.is_err() {
        let left = std::fs::read_to_string(&spool).map(|s| s.lines().count());
        panic!(
            "records missing (spool: {left:?}); the gateway said:\n{}",
            g.stop_and_stderr()
        );
    }
    common::eventually_async(
        Duration::from_secs(10),
        "the spool was not emptied",
        async || {
            if spool.exists() {
                Err(String::new())
            } else {
                Ok(())
            }
        },
    )
    .await;
}

/// Postgres away when the gateway stops: the records wait in the spool on disk and are
/// written at the next start.
#[tokio::test(flavor = "multi_thread")]
async fn records_spooled_at_a_stop_are_written_at_the_next_start() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    let mut g = start_with(Setup {
        extra_config: pg_config(&pg),
        ..Setup::default()
    });
    pg.down();
    let mut ids = HashSet::new();
    for _ in 0..25 {
        let r = send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body("echo-1", false),
            &[],
        )
        .await;
        ids.extend(request_ids(vec![r]).await);
    }
    assert!(g.terminate().success());
    let spool = g.dir.path().join("usage-spool.jsonl");
    let lines = std::fs::read_to_string(&spool)
        .expect("the spool")
        .lines()
        .count();
    assert_eq!(lines, 25);
    pg.up();
    let _g = g.restart_stopped();
    await_rows(&pg, &ids, Duration::from_secs(15));
}

/// Postgres that stops answering without closing its connections (its processes frozen, as a
/// host gone quiet behind a live kernel): the gateway answers on, its records go to the spool
/// once a batch has waited 10 s, a SIGTERM exits at once instead of waiting on the database
/// for good, and the records are all written, once each, when it answers again.
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_that_stops_answering_holds_no_record_and_no_shutdown() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    let mut g = start_with(Setup {
        extra_config: pg_config(&pg),
        ..Setup::default()
    });
    let body = chat_body("echo-1", false);
    let main = g.main.clone();
    let chat = || send(&main, "/v1/chat/completions", Some(KEY), &body, &[]);
    let mut ids: HashSet<String> = request_ids(vec![chat().await]).await.into_iter().collect();
    await_rows(&pg, &ids, Duration::from_secs(15));
    // Reads at once leave their connections pooled, idle: the shutdown must not wait on
    // them either.
    let mut reads = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let main = g.main.clone();
        reads.spawn(async move { common::get(&main, "/api/usage?limit=1", Some(KEY)).await });
    }
    while let Some(read) = reads.join_next().await {
        let read = read.expect("read");
        assert_eq!(read.status(), 200);
        ids.insert(request_id(&read));
    }
    // Every server process of the gateway's connections, frozen.
    let pids: Vec<i32> = common::pg::off_runtime(|| {
        pg.client()
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'modelgate'",
                &[],
            )
            .expect("pids")
            .iter()
            .map(|r| r.get(0))
            .collect()
    });
    assert!(!pids.is_empty());
    let signal = |sig: &str| {
        for pid in &pids {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        }
    };
    signal("-STOP");
    for _ in 0..20 {
        ids.extend(request_ids(vec![chat().await]).await);
    }
    let spooled = || {
        std::fs::read_to_string(g.dir.path().join("usage-spool.jsonl"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    common::eventually_async(
        Duration::from_secs(30),
        "fewer than 20 records spooled",
        async || match spooled() {
            n if n < 20 => Err(format!("{n} records spooled")),
            _ => Ok(()),
        },
    )
    .await;
    let started = Instant::now();
    assert!(tokio::task::block_in_place(|| g.terminate()).success());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The last word says records wait in the spool, not only that they were written.
    let said = g.take_stderr();
    assert!(said.contains("spooled_bytes"), "{said}");
    signal("-CONT");
    let _g = g.restart_stopped();
    await_rows(&pg, &ids, Duration::from_secs(15));
}

/// Keys kept in Postgres (`[keys] source = "postgres"`): a key imported from a file works on
/// every gateway without its secret in the table; a key created in one gateway's console
/// works on the other within a second, and so does its revocation; the audit log is shared.
#[tokio::test(flavor = "multi_thread")]
async fn keys_in_postgres_are_shared_by_the_fleet_within_a_second() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    let setup = || Setup {
        extra_config: format!(
            "{}\n[console]\nuser = \"admin\"\npassword = \"env:MG_TEST_CONSOLE_PW\"\n",
            pg_config(&pg)
        ),
        keys_extra: "source = \"postgres\"\n".into(),
        // Polling with a key not yet known must not trip the wrong-key throttle.
        limits_extra: "auth_failures_per_minute = 0\n".into(),
        env: vec![("MG_TEST_CONSOLE_PW".into(), "pw-fleet-2".into())],
        ..Setup::default()
    };
    let a = start_with(setup());
    let b = start_with(setup());
    // The table starts empty: the harness's keys file is not read.
    assert_eq!(
        common::get(&b.direct, "/v1/models", Some(KEY))
            .await
            .status(),
        401
    );
    // `keys import` from the file, as an operator moves a gateway's keys to the fleet.
    let out = std::process::Command::new(common::bin())
        .args(["keys", "import", "--config"])
        .arg(a.dir.path().join("modelgate.toml"))
        .env("MG_TEST_CONSOLE_PW", "pw-fleet-2")
        .output()
        .expect("keys import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exported = std::process::Command::new(common::bin())
        .args(["keys", "export", "--config"])
        .arg(a.dir.path().join("modelgate.toml"))
        .env("MG_TEST_CONSOLE_PW", "pw-fleet-2")
        .output()
        .expect("keys export");
    let exported = String::from_utf8(exported.stdout).expect("utf-8");
    assert!(exported.contains("id = \"full\"") && exported.contains("secret_sha256"));
    assert!(!exported.contains(KEY), "a secret in clear in the table");
    for g in [&a, &b] {
        await_status(g, KEY, 200).await;
    }
    // A key made in a's console works on b within a second.
    let console = |base: &str| {
        let base = base.to_string();
        async move {
            let login = common::client()
                .post(format!("{base}/console/login"))
                .json(&serde_json::json!({"user": "admin", "password": "pw-fleet-2"}))
                .send()
                .await
                .expect("login");
            assert_eq!(login.status(), 204);
            login.headers()["set-cookie"]
                .to_str()
                .expect("cookie")
                .split(';')
                .next()
                .expect("pair")
                .to_string()
        }
    };
    let cookie = console(&a.main).await;
    let secret = console_create(
        &a.main,
        &cookie,
        serde_json::json!({"id": "fleet-new", "rpm": 50}),
    )
    .await;
    let took = await_status(&b, &secret, 200).await;
    assert!(took < Duration::from_secs(1), "seen on b after {took:?}");
    // Revoked on b's console: refused on a within a second.
    let cookie_b = console(&b.main).await;
    console_delete(&b.main, &cookie_b, "fleet-new").await;
    let took = await_status(&a, &secret, 401).await;
    assert!(
        took < Duration::from_secs(1),
        "still accepted on a after {took:?}"
    );
    // One audit log for the fleet: b lists a's create.
    let audit: serde_json::Value = common::client()
        .get(format!("{}/console/api/audit", b.main))
        .header("cookie", &cookie_b)
        .send()
        .await
        .expect("audit")
        .json()
        .await
        .expect("json");
    let text = audit.to_string();
    assert!(
        text.contains("fleet-new") && text.contains("create"),
        "{text}"
    );
    // A row broken by hand in SQL keeps its version in force and blocks no other change: a
    // revocation made after it takes effect. A row whose entry names another id is not taken.
    common::pg::off_runtime(|| {
        let mut c = pg.client();
        c.execute("UPDATE keys SET entry = 'id = ' WHERE id = 'full'", &[])
            .expect("break a row");
        c.execute(
            "UPDATE keys SET entry = replace(entry, 'id = \"conc\"', 'id = \"elsewhere\"') \
             WHERE id = 'conc'",
            &[],
        )
        .expect("rename inside a row");
        c.execute("DELETE FROM keys WHERE id = 'other'", &[])
            .expect("revoke");
    });
    for g in [&a, &b] {
        await_status(g, OTHER_KEY, 401).await;
        assert_eq!(
            common::get(&g.direct, "/v1/models", Some(KEY))
                .await
                .status(),
            200
        );
        assert_eq!(
            common::get(&g.direct, "/v1/models", Some(common::CONC_KEY))
                .await
                .status(),
            200
        );
    }
    // A console edit goes through beside the broken rows, a row copying another's secret is
    // not taken (the other keeps working), and the console deletes a broken row.
    common::pg::off_runtime(|| {
        pg.client()
            .execute(
                "INSERT INTO keys (id, entry, updated_ms) SELECT 'zz-copy', \
                 replace(entry, 'id = \"rpm2\"', 'id = \"zz-copy\"'), 0 FROM keys \
                 WHERE id = 'rpm2'",
                &[],
            )
            .expect("copy a secret")
    });
    let secret = console_create(&a.main, &cookie, serde_json::json!({"id": "after-break"})).await;
    await_status(&b, &secret, 200).await;
    assert_eq!(
        common::get(&b.direct, "/v1/models", Some(common::RPM2_KEY))
            .await
            .status(),
        200
    );
    console_delete(&a.main, &cookie, "full").await;
    await_status(&b, KEY, 401).await;
    // A gateway started now takes the rows that pass, and leaves the broken ones out.
    let c = start_with(setup());
    await_status(&c, common::RPM2_KEY, 200).await;
    assert_eq!(
        common::get(&c.direct, "/v1/models", Some(KEY))
            .await
            .status(),
        401
    );
}

/// Polls `GET /v1/models` with `key` until it answers `status`; how long that took.
/// Creates a key through the console at `base` (signed in with `cookie`); its secret.
async fn console_create(base: &str, cookie: &str, body: serde_json::Value) -> String {
    let made = common::client()
        .post(format!("{base}/console/api/keys"))
        .header("cookie", cookie)
        .header("origin", base)
        .json(&body)
        .send()
        .await
        .expect("create");
    assert!(made.status().is_success(), "{}", made.status());
    made.json::<serde_json::Value>().await.expect("json")["secret"]
        .as_str()
        .expect("secret")
        .to_string()
}

/// Deletes the key `id` through the console at `base`.
async fn console_delete(base: &str, cookie: &str, id: &str) {
    let del = common::client()
        .delete(format!("{base}/console/api/keys/{id}"))
        .header("cookie", cookie)
        .header("origin", base)
        .send()
        .await
        .expect("delete");
    assert!(del.status().is_success(), "{}", del.status());
}

async fn await_status(g: &common::Gateway, key: &str, status: u16) -> Duration {
    let start = Instant::now();
    loop {
        if common::get(&g.direct, "/v1/models", Some(key))
            .await
            .status()
            == status
        {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A gateway whose Postgres cannot be reached at start exits at once (status 2) and says which
/// store, without the connection string's password.
#[test]
fn a_gateway_whose_postgres_is_unreachable_does_not_start_and_says_why() {
    let dir = tempfile::tempdir().expect("tmp");
    let dead = common::free_port();
    let config = format!(
        "[listeners]\nmain = \"127.0.0.1:{}\"\ndirect = \"127.0.0.1:{}\"\nadmin = \"127.0.0.1:{}\"\n\
         [keys]\nfile = \"keys.toml\"\n[storage]\npostgres = \"postgres://mg:hunter2-secret@127.0.0.1:{dead}/mg\"\n\
         [[pools]]\nname = \"p\"\nupstreams = [\"http://127.0.0.1:1\"]\n[[models]]\nname = \"m\"\npool = \"p\"\n",
        common::free_port(),
        common::free_port(),
        common::free_port()
    );
    std::fs::write(dir.path().join("modelgate.toml"), config).expect("config");
    std::fs::write(dir.path().join("keys.toml"), "").expect("keys");
    let start = Instant::now();
    let out = std::process::Command::new(common::bin())
        .args(["serve", "--config"])
        .arg(dir.path().join("modelgate.toml"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(start.elapsed() < Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot open the usage store postgres") && err.contains("connecting"),
        "{err}"
    );
    // The cause is named, not only "error connecting to server".
    assert!(err.contains("Connection refused"), "{err}");
    assert!(!err.contains("hunter2"), "the password in the log: {err}");
}

/// Without Redis, gateways sharing Postgres still share budgets: each raises its spend to the
/// store's totals, so a budget spent on one is refused on the other within seconds.
#[tokio::test(flavor = "multi_thread")]
async fn without_redis_a_budget_spent_on_one_gateway_is_refused_on_the_other() {
    let Some(pg) = Postgres::start_or_skip() else {
        return;
    };
    // Today's rule: a request may pass the budget (12.5 of 10), the next is refused.
    let setup = || Setup {
        extra_config: pg_config(&pg),
        limits_extra: "budget_mode = \"after\"\n".into(),
        ..Setup::default()
    };
    let (a, b) = (start_with(setup()), start_with(setup()));
    // priced-model costs 12.5 a request; "budgeted" has 10.
    let r = send(
        &a.direct,
        "/v1/chat/completions",
        Some(common::BUDGET_KEY),
        &chat_body("priced-model", false),
        &[],
    )
    .await;
    assert_eq!(r.status(), 200);
    common::eventually_async(
        Duration::from_secs(10),
        "b never saw a's spend",
        async || {
            let r = send(
                &b.direct,
                "/v1/chat/completions",
                Some(common::BUDGET_KEY),
                &chat_body("echo-1", false),
                &[],
            )
            .await;
            if r.status() == 402 {
                return Ok(());
            }
            assert_eq!(r.status(), 200);
            Err(String::new())
        },
    )
    .await;
}
