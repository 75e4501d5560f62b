//! A journal on a full disk (a 64 KiB tmpfs, mounted by the test: it runs as root, as CI
//! does): every request is still served and recorded (records go on to the store), and each
//! journal line that could not be written is counted on `/metrics`.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{KEY, Setup, send, start_with};

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
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
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
            break;
        }
        assert!(Instant::now() < deadline, "{chats} of 300 records");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failures = common::metric_value(&g, "modelgate_usage_journal_failures_total").await;
    assert!(failures > 0.0, "{failures}");
    drop(g);
}
