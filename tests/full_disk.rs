//! Full disks. The journal on a full disk (a 64 KiB tmpfs, mounted by the test: it runs as
//! root, as CI does): every request is still served and recorded (records go on to the store),
//! and each journal line that could not be written is counted on `/metrics`. The database and
//! the spool on one full disk: records wait in memory up to `memory_max_records`; past it new
//! requests get 503 `usage_store_unavailable` (`on_store_full = "refuse"`: none lost) or are
//! served with their records dropped and counted (`"serve"`); once space is back every record
//! that waited is written.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Gateway, KEY, Setup, send, start_with};

/// A small tmpfs, unmounted when dropped.
struct Tmpfs(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).expect("mkdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs (the test needs root, as CI runs)");
        Tmpfs(path, dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_journal_on_a_full_disk_is_counted_and_no_record_is_lost() {
    let fs = Tmpfs::mount("64k");
    let g = start_with(Setup {
        extra_config: format!("[storage]\njournal = \"{}\"\n", fs.0.join("j").display()),
        ..Setup::default()
    });
    // About 600 bytes of journal a request: 300 fill 64 KiB almost three times over.
    let mut last = String::new();
    for _ in 0..300 {
        let r = send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &common::chat_body("echo-1", false),
            &[],
        )
        .await;
        assert_eq!(r.status(), 200);
        last = common::request_id(&r);
        r.bytes().await.expect("body");
    }
    common::await_record(&g, &last).await;
    common::eventually_async(Duration::from_secs(5), "not 300 chat records", async || {
        let page: serde_json::Value = common::get(&g.direct, "/api/usage?limit=1000", Some(KEY))
            .await
            .json()
            .await
            .expect("json");
        // The usage calls that read them have records of their own.
        let chats = page["data"]
            .as_array()
            .map_or(0, |d| d.iter().filter(|r| r["endpoint"] == "chat").count());
        if chats == 300 {
            Ok(())
        } else {
            Err(format!("{chats} of 300 records"))
        }
    })
    .await;
    let failures = common::metric_value(&g, "modelgate_usage_journal_failures_total").await;
    assert!(failures > 0.0, "{failures}");
    drop(g);
}

/// Fills the file system at `dir` to its last byte with `filler`.
fn fill(dir: &std::path::Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    for chunk in [65_536, 4_096, 512, 1] {
        let buf = vec![7u8; chunk];
        while f.write_all(&buf).and_then(|()| f.flush()).is_ok() {}
    }
    path
}

/// The config of a gateway whose database and spool are on `fs`.
fn store_on(fs: &Tmpfs, mode: &str) -> Setup {
    Setup {
        extra_config: format!(
            "[storage]\nsqlite = \"{db}\"\nspool = \"{spool}\"\nmemory_max_records = 40\n\
             on_store_full = \"{mode}\"\n",
            db = fs.0.join("usage.db").display(),
            spool = fs.0.join("spool.jsonl").display(),
        ),
        ..Setup::default()
    }
}

async fn chat(g: &Gateway) -> reqwest::Response {
    send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &common::chat_body("echo-1", false),
        &[],
    )
    .await
}

/// Waits (up to 15 s) until the gateway holds no record in memory and is ready again.
async fn await_stored_again(g: &Gateway) {
    common::eventually_async(
        Duration::from_secs(15),
        "not stored again and ready",
        async || {
            let held = common::metric_value(g, "modelgate_usage_records_held").await;
            let ready = common::get(&g.admin, "/readyz", None).await.status() == 200;
            if held == 0.0 && ready {
                Ok(())
            } else {
                Err(format!("{held} records still held"))
            }
        },
    )
    .await;
}

/// The chat records the store has, by request id.
async fn chat_records(g: &Gateway) -> std::collections::HashSet<String> {
    let page: serde_json::Value = common::get(&g.direct, "/api/usage?limit=1000", Some(KEY))
        .await
        .json()
        .await
        .expect("json");
    page["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter(|r| r["endpoint"] == "chat")
        .map(|r| r["request_id"].as_str().expect("id").to_string())
        .collect()
}

/// Waits (up to 15 s) until the store has a record of every one of `served`: a reply's
/// record is made after its client has the reply, so the last ones may still be on their way.
async fn await_every_record(g: &Gateway, served: &[String]) -> std::collections::HashSet<String> {
    common::eventually_async(Duration::from_secs(15), "records lost", async || {
        let have = chat_records(g).await;
        match served.iter().filter(|id| !have.contains(*id)).count() {
            0 => Ok(have),
            n => Err(format!("{n} of {} missing", served.len())),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_store_refuses_new_requests_and_loses_no_record() {
    let fs = Tmpfs::mount("2m");
    let g = start_with(store_on(&fs, "refuse"));
    let first = chat(&g).await;
    assert_eq!(first.status(), 200);
    let mut served = vec![common::request_id(&first)];
    common::await_record(&g, &served[0]).await;
    let filler = fill(&fs.0);
    // Records wait in memory until 40 do; then requests are refused.
    let refused = loop {
        let r = chat(&g).await;
        if r.status() == 503 {
            break r;
        }
        assert_eq!(r.status(), 200);
        served.push(common::request_id(&r));
        assert!(served.len() < 2_000, "never refused");
    };
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().ok()),
        Some(Some("5"))
    );
    let body: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "usage_store_unavailable", "{body}");
    // A usage call, which would leave a record too, is refused the same way.
    let call = common::get(&g.main, "/api/usage?limit=1", Some(common::KEY)).await;
    assert_eq!(call.status(), 503);
    let body: serde_json::Value = call.json().await.expect("json");
    assert_eq!(body["error"]["code"], "usage_store_unavailable", "{body}");
    let ready = common::get(&g.admin, "/readyz", None).await;
    assert_eq!(ready.status(), 503);
    let reasons = ready.text().await.expect("text");
    assert!(reasons.contains("the usage store is full"), "{reasons}");
    assert_eq!(
        common::metric_value(&g, "modelgate_usage_store_full").await,
        1.0
    );
    assert!(common::metric_value(&g, "modelgate_usage_records_held").await >= 1.0);
    assert!(common::metric_value(&g, "modelgate_usage_store_refused_total").await >= 1.0);
    // Space comes back: every record that waited is written, and requests are served again.
    std::fs::remove_file(filler).expect("free");
    await_stored_again(&g).await;
    let after = chat(&g).await;
    assert_eq!(after.status(), 200);
    served.push(common::request_id(&after));
    let have = await_every_record(&g, &served).await;
    assert_eq!(have.len(), served.len());
    assert_eq!(
        common::metric_value(&g, "modelgate_usage_records_dropped_total").await,
        0.0
    );
    assert_eq!(
        common::metric_value(&g, "modelgate_usage_record_write_errors_total").await,
        0.0
    );
    let (_, log) = g.terminate_and_stderr();
    assert_eq!(log.matches("usage store full").count(), 1, "{log}");
    assert!(log.contains("records are stored again"), "{log}");
    // The exit line says none was lost (it says so only when some were).
    assert!(!log.contains("not written"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_store_in_serve_mode_serves_and_counts_every_dropped_record() {
    let fs = Tmpfs::mount("2m");
    let g = start_with(store_on(&fs, "serve"));
    let first = chat(&g).await;
    assert_eq!(first.status(), 200);
    common::await_record(&g, &common::request_id(&first)).await;
    let filler = fill(&fs.0);
    let mut served = 1;
    while common::metric_value(&g, "modelgate_usage_records_dropped_total").await < 20.0 {
        let r = chat(&g).await;
        assert_eq!(r.status(), 200, "served in serve mode");
        served += 1;
        assert!(served < 3_000, "nothing dropped");
    }
    assert_eq!(common::get(&g.admin, "/readyz", None).await.status(), 503);
    std::fs::remove_file(filler).expect("free");
    await_stored_again(&g).await;
    // The last reply's record is made after its client has the reply: every request is
    // either stored or counted as dropped once it settles.
    common::eventually_async(
        Duration::from_secs(15),
        "a record neither stored nor counted as dropped",
        async || {
            let have = chat_records(&g).await.len() as f64;
            let dropped = common::metric_value(&g, "modelgate_usage_records_dropped_total").await;
            if have + dropped == f64::from(served) {
                Ok(())
            } else {
                Err(format!("{have} stored, {dropped} dropped of {served}"))
            }
        },
    )
    .await;
    let dropped = common::metric_value(&g, "modelgate_usage_records_dropped_total").await;
    assert_eq!(
        common::metric_value(&g, "modelgate_usage_record_write_errors_total").await,
        0.0
    );
    // One line when the drops began, one when the store had room again, with their count;
    // the exit line says as much.
    let (_, log) = g.terminate_and_stderr();
    assert_eq!(log.matches("usage records dropped").count(), 1, "{log}");
    assert!(
        log.contains(&format!(
            "none waits in memory ({dropped} dropped meanwhile)"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("usage records: {dropped} not written")),
        "{log}"
    );
}

/// The database on a full disk, the spool beside it bounded (`spool_max_bytes`): records go to
/// the spool up to its bound, then wait in memory up to theirs, then new requests are
/// refused; once the database has room every one of them is written.
#[tokio::test(flavor = "multi_thread")]
async fn the_spool_takes_records_up_to_its_bound_then_memory_then_none() {
    let fs = Tmpfs::mount("2m");
    let spool_dir = tempfile::tempdir().expect("tmp");
    let g = start_with(Setup {
        extra_config: format!(
            "[storage]\nsqlite = \"{db}\"\nspool = \"{spool}\"\nspool_max_bytes = 8192\n\
             memory_max_records = 40\n",
            db = fs.0.join("usage.db").display(),
            spool = spool_dir.path().join("spool.jsonl").display(),
        ),
        ..Setup::default()
    });
    let first = chat(&g).await;
    assert_eq!(first.status(), 200);
    let mut served = vec![common::request_id(&first)];
    common::await_record(&g, &served[0]).await;
    let filler = fill(&fs.0);
    let mut spooled_max = 0.0f64;
    loop {
        let r = chat(&g).await;
        if r.status() == 503 {
            break;
        }
        assert_eq!(r.status(), 200);
        served.push(common::request_id(&r));
        assert!(served.len() < 2_000, "never refused");
        spooled_max =
            spooled_max.max(common::metric_value(&g, "modelgate_usage_spool_bytes").await);
    }
    // The spool held records, never past its bound; memory held the rest, to its bound.
    assert!(spooled_max > 0.0, "nothing spooled");
    assert!(spooled_max <= 8192.0, "{spooled_max} bytes spooled");
    assert!(served.len() > 40, "{} served", served.len());
    assert!(common::metric_value(&g, "modelgate_usage_records_held").await >= 1.0);
    std::fs::remove_file(filler).expect("free");
    await_stored_again(&g).await;
    common::eventually_async(
        Duration::from_secs(15),
        "records still spooled",
        async || match common::metric_value(&g, "modelgate_usage_spool_bytes").await {
            0.0 => Ok(()),
            b => Err(format!("{b} bytes")),
        },
    )
    .await;
    await_every_record(&g, &served).await;
}
