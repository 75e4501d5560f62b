//! A gateway killed with SIGKILL under load loses no record: every request that passed auth
//! and whose reply the client saw begin has exactly one record after the restart (its own,
//! or one cut by the crash, billed its prompt; its own, with its cost, when the client read
//! the reply whole),
//! and spend is the sum of the records. Also with the SQLite file
//! locked by another connection at the moment of the kill.
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Gateway, KEY, Setup, client, send, start_with};
use serde_json::Value;

/// Mixed load until `stop`: plain chats, streams read whole (some with no usage from the
/// upstream), streams left after their first piece, slow streams still running at the kill,
/// and usage calls. Each reply's request id is
/// noted.
fn load(
    g: &Gateway,
    seen: Arc<Mutex<HashSet<String>>>,
    whole: Arc<Mutex<HashSet<String>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let usage_calls = {
        let (base, seen) = (g.direct.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok(r) = client()
                    .get(format!("{base}/api/usage?limit=1"))
                    .bearer_auth(KEY)
                    .send()
                    .await
                else {
                    return;
                };
                let Some(id) = r.headers().get("x-request-id").cloned() else {
                    return;
                };
                seen.lock()
                    .expect("seen")
                    .insert(id.to_str().expect("id").to_string());
                if r.bytes().await.is_err() {
                    return;
                }
            }
        })
    };
    (0..16)
        .map(|i| {
            let base = [&g.main, &g.direct][i % 2].clone();
            let (seen, whole) = (seen.clone(), whole.clone());
            tokio::spawn(async move {
                for n in 0.. {
                    let kind = (i + n) % 5;
                    let stream = kind != 0;
                    let delay = if kind == 3 { "50" } else { "0" };
                    // Kind 4: a stream whose upstream reports no usage (estimated).
                    let no_usage = if kind == 4 { "1" } else { "0" };
                    let r = send(
                        &base,
                        "/v1/chat/completions",
                        Some(KEY),
                        &common::chat_body("priced-model", stream),
                        &[
                            ("x-mock-delay-ms", delay),
                            ("x-mock-ignore-include-usage", no_usage),
                        ],
                    )
                    .await;
                    let Some(id) = r.headers().get("x-request-id").cloned() else {
                        return;
                    };
                    seen.lock()
                        .expect("seen")
                        .insert(id.to_str().expect("id").to_string());
                    if kind == 2 {
                        // A client that leaves after the first piece.
                        let mut body = r.bytes_stream();
                        let _ = futures_util::StreamExt::next(&mut body).await;
                        continue;
                    }
                    let id = id.to_str().expect("id").to_string();
                    if r.bytes().await.is_err() {
                        return;
                    }
                    whole.lock().expect("whole").insert(id);
                }
            })
        })
        .chain(std::iter::once(usage_calls))
        .collect()
}

/// Every record of `KEY`, by request id (each id once at most), once those of `seen` are in.
async fn records(g: &Gateway, seen: &HashSet<String>) -> HashMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = HashMap::new();
        let mut duplicate = None;
        for r in common::all_records(&g.direct, KEY).await {
            let id = r["request_id"].as_str().unwrap_or("").to_string();
            if all.insert(id.clone(), r).is_some() {
                duplicate = Some(id);
            }
        }
        assert_eq!(duplicate, None, "a request with two records");
        if seen.iter().all(|id| all.contains_key(id)) || Instant::now() > deadline {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn killed_under_load(lock_sqlite: bool) {
    let mut g = start_with(Setup::default());
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let whole = Arc::new(Mutex::new(HashSet::new()));
    let tasks = load(&g, seen.clone(), whole.clone());
    common::eventually_async(Duration::from_secs(10), "too slow", async || {
        let n = seen.lock().expect("seen").len();
        if n < 200 {
            Err(format!("{n} of 200 seen"))
        } else {
            Ok(())
        }
    })
    .await;
    // Another process's write lock on the database at the moment of the kill.
    let locker = lock_sqlite.then(|| {
        let db = g.dir.path().join("usage.db");
        let c = rusqlite::Connection::open(db).expect("open");
        c.execute_batch("BEGIN EXCLUSIVE").expect("lock");
        c
    });
    if locker.is_some() {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    g.signal("-KILL");
    drop(locker);
    for t in tasks {
        let _ = t.await;
    }
    let seen = seen.lock().expect("seen").clone();
    let g = g.restart_stopped();
    let all = records(&g, &seen).await;
    let missing: Vec<&String> = seen.iter().filter(|id| !all.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} replies without a record: {:?}",
        missing.len(),
        seen.len(),
        &missing[..missing.len().min(5)]
    );
    // A reply the client read whole has its own record, with its cost: the record went to
    // the journal before the reply's last byte.
    for id in whole.lock().expect("whole").iter() {
        let r = &all[id];
        assert_eq!(r["cut"], "", "{r}");
        assert!(r["cost"].as_f64() > Some(0.0), "{r}");
    }
    let crashed = all.values().filter(|r| r["cut"] == "crash").count();
    assert!(
        crashed > 0,
        "the slow streams at the kill are cut by the crash"
    );
    // Each went upstream: its prompt is billed, estimated from its size.
    for r in all.values().filter(|r| r["cut"] == "crash") {
        assert_eq!(r["estimated"], true, "{r}");
        if r["endpoint"] == "usage" {
            continue;
        }
        assert_eq!(r["model"], "priced-model", "{r}");
        assert!(r["prompt_tokens"].as_u64() > Some(0), "{r}");
        assert!(r["cost"].as_f64() > Some(0.0), "{r}");
    }
    let billed: f64 = all
        .values()
        .map(|r| r["cost"].as_f64().unwrap_or(0.0))
        .sum();
    let spent = common::spend_of(&g, KEY).await;
    assert!(
        (billed - spent).abs() < 1e-6,
        "records {billed}, spend {spent}"
    );
    assert!(spent > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_under_load_loses_no_record() {
    killed_under_load(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_while_another_process_locks_the_database_loses_no_record() {
    killed_under_load(true).await;
}

/// A request killed while its client still uploads its body has its record at the next start
/// (its entry is written before the gateway waits for the body).
#[tokio::test(flavor = "multi_thread")]
async fn a_request_killed_while_its_body_comes_has_its_record() {
    use tokio::io::AsyncWriteExt;
    let mut g = start_with(Setup::default());
    let addr = g.main.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"model\":"
    );
    conn.write_all(head.as_bytes()).await.expect("write");
    // Its entry is in the journal once the gateway waits for the rest.
    let journal = g.dir.path().join("usage-journal");
    common::eventually_async(Duration::from_secs(5), "no entry written", async || {
        let lines: usize = std::fs::read_dir(&journal)
            .map_err(|e| e.to_string())?
            .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
            .map(|b| b.windows(7).filter(|w| w == b"{\"open\"").count())
            .sum();
        if lines > 0 {
            Ok(())
        } else {
            Err("no open line".to_string())
        }
    })
    .await;
    g.signal("-KILL");
    drop(conn);
    let g = g.restart_stopped();
    let crashed = common::eventually_async(Duration::from_secs(10), "no record", async || {
        let page: Value = common::get(&g.direct, "/api/usage?limit=100", Some(KEY))
            .await
            .json()
            .await
            .expect("json");
        page["data"]
            .as_array()
            .and_then(|d| d.iter().find(|r| r["cut"] == "crash").cloned())
            .ok_or_else(|| format!("{page}"))
    })
    .await;
    assert_eq!(crashed["status"], 500, "{crashed}");
    assert_eq!(crashed["estimated"], true, "{crashed}");
}
