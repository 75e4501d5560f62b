//! The soak: `bash benches/soak.sh` (SOAK_MINUTES=30 by default) runs the release binary under
//! mixed load for that long and checks, at the end, what must hold for weeks of traffic:
//!
//! - RSS flat: after a warm-up (the first sixth of the run), no sample more than 10% above the
//!   warm-up level; open file descriptors do not grow;
//! - every request answered (a transport error on a request the client did not cancel is a
//!   failure);
//! - usage records = requests that passed auth, counted in the SQLite store after the gateway
//!   has stopped;
//! - no warning or error in the gateway's log that the run does not explain (the upstream being
//!   restarted, the keys reloads).
//!
//! The load, from 32 workers: plain chats, streams of 20 events, streams cancelled after the
//! first event, wrong keys (from 127.0.0.3, so that their throttle does not touch the rest),
//! bodies over `max_body_bytes` (413), and model lists; the keys file rewritten every 10 s; one
//! of the pool's two upstreams (`modelgate mock-upstream`) killed and started again every
//! minute.
//!
//! Usage: soak BIN SECONDS — prints a summary and exits 1 if a check fails.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

const KEY: &str = "sk-soak-key-0000000000000001";
const WORKERS: usize = 32;
const MAX_BODY: usize = 1 << 20;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn keys_file(generation: u64) -> String {
    format!(
        "# generation {generation}\n[[keys]]\nid = \"soak\"\nsecret = \"{KEY}\"\n\n\
         [[keys]]\nid = \"rotating-{generation}\"\nsecret = \"sk-rotating-{generation:020}\"\n"
    )
}

fn mock(bin: &Path, port: u16) -> Child {
    let child = Command::new(bin)
        .args(["mock-upstream", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--chunks", "20", "--delay-ms", "5"])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "mock did not listen");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// (RSS in KiB, open fds) of a process.
fn usage_of(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

#[derive(Default)]
struct Counts {
    /// (kind, status or "error") -> requests.
    by: Mutex<BTreeMap<(String, String), u64>>,
    /// Requests sent with the good key (each must leave one record).
    authed: AtomicU64,
    unanswered: AtomicU64,
}

impl Counts {
    async fn add(&self, kind: &str, outcome: String) {
        *self
            .by
            .lock()
            .await
            .entry((kind.to_string(), outcome))
            .or_default() += 1;
    }
}

async fn worker(
    n: usize,
    base: String,
    good: reqwest::Client,
    bad: reqwest::Client,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) {
    let chat = serde_json::json!({"model": "echo-1",
        "messages": [{"role": "user", "content": "tell me something"}]});
    let streamed = serde_json::json!({"model": "echo-1", "stream": true,
        "messages": [{"role": "user", "content": "tell me something"}]});
    let oversized = vec![b'x'; MAX_BODY + 1024];
    let url = format!("{base}/v1/chat/completions");
    let mut i = n as u64;
    while !stop.load(Ordering::Relaxed) {
        i = i
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pick = (i >> 33) % 100;
        let (kind, result) = match pick {
            0..40 => {
                counts.authed.fetch_add(1, Ordering::Relaxed);
                let r = good.post(&url).bearer_auth(KEY).json(&chat).send().await;
                ("plain", finish(r).await)
            }
            40..68 => {
                counts.authed.fetch_add(1, Ordering::Relaxed);
                let r = good
                    .post(&url)
                    .bearer_auth(KEY)
                    .json(&streamed)
                    .send()
                    .await;
                ("stream", finish(r).await)
            }
            68..76 => {
                counts.authed.fetch_add(1, Ordering::Relaxed);
                let r = good
                    .post(&url)
                    .bearer_auth(KEY)
                    .json(&streamed)
                    .send()
                    .await;
                let out = match r {
                    Ok(mut resp) => {
                        let status = resp.status().as_u16().to_string();
                        // The first piece, then the client goes away.
                        let _ = resp.chunk().await;
                        drop(resp);
                        Ok(status)
                    }
                    Err(e) => Err(e),
                };
                ("cancel", out)
            }
            76..86 => {
                let r = bad
                    .post(&url)
                    .bearer_auth(format!("sk-wrong-{i}"))
                    .json(&chat)
                    .send()
                    .await;
                ("wrong key", finish(r).await)
            }
            86..90 => {
                counts.authed.fetch_add(1, Ordering::Relaxed);
                let r = good
                    .post(&url)
                    .bearer_auth(KEY)
                    .header("content-type", "application/json")
                    .body(oversized.clone())
                    .send()
                    .await;
                ("oversized", finish(r).await)
            }
            _ => {
                counts.authed.fetch_add(1, Ordering::Relaxed);
                let r = good
                    .get(format!("{base}/v1/models"))
                    .bearer_auth(KEY)
                    .send()
                    .await;
                ("models", finish(r).await)
            }
        };
        match result {
            Ok(status) => counts.add(kind, status).await,
            Err(e) => {
                counts.unanswered.fetch_add(1, Ordering::Relaxed);
                counts.add(kind, format!("error: {e}")).await;
            }
        }
    }
}

/// The status once the whole reply is read, or "cut" when the reply began but did not end
/// (a stream whose upstream was killed under it: the gateway records it as 502).
async fn finish(r: reqwest::Result<reqwest::Response>) -> reqwest::Result<String> {
    let resp = r?;
    let status = resp.status().as_u16().to_string();
    Ok(match resp.bytes().await {
        Ok(_) => status,
        Err(_) => "cut".to_string(),
    })
}

/// Log lines the run explains: upstreams going away and coming back, keys reloads.
fn explained(line: &str) -> bool {
    const EXPECTED: [&str; 8] = [
        "Connection refused",
        "ConnectRefused",
        "ConnectionClosed",
        "upstream",
        "health",
        "keys",
        "reload",
        "Broken pipe",
    ];
    EXPECTED.iter().any(|e| line.contains(e))
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let bin = PathBuf::from(args.next().expect("usage: soak BIN SECONDS"));
    let seconds: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .expect("usage: soak BIN SECONDS");
    let dir = tempfile::tempdir().expect("tmp");
    let (main_port, admin_port) = (free_port(), free_port());
    let ups = [free_port(), free_port()];
    std::fs::write(dir.path().join("keys.toml"), keys_file(0)).expect("keys");
    std::fs::write(
        dir.path().join("modelgate.toml"),
        format!(
            "[listeners]\nmain = \"127.0.0.1:{main_port}\"\nadmin = \"127.0.0.1:{admin_port}\"\n\n\
             [keys]\nfile = \"keys.toml\"\n\n[storage]\nsqlite = \"usage.db\"\n\n\
             [limits]\nmax_body_bytes = {MAX_BODY}\n\n[log]\naccess = \"off\"\n\n\
             [server]\nthreads = 1\n\n\
             [[pools]]\nname = \"local\"\nupstreams = [\"http://127.0.0.1:{}\", \"http://127.0.0.1:{}\"]\n\
             health_interval_ms = 1000\n\n\
             [[models]]\nname = \"echo-1\"\npool = \"local\"\n",
            ups[0], ups[1]
        ),
    )
    .expect("config");
    let mut mocks = [mock(&bin, ups[0]), mock(&bin, ups[1])];
    let mut gateway = Command::new(&bin)
        .args(["serve", "--config"])
        .arg(dir.path().join("modelgate.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gateway");
    let pid = gateway.id();
    let stderr = gateway.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let mut stderr = stderr;
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", main_port)).is_err() {
        assert!(Instant::now() < deadline, "gateway did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let base = format!("http://127.0.0.1:{main_port}");
    let good = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let bad = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 3]))
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..WORKERS {
        tasks.spawn(worker(
            n,
            base.clone(),
            good.clone(),
            bad.clone(),
            counts.clone(),
            stop.clone(),
        ));
    }

    let started = Instant::now();
    let run = Duration::from_secs(seconds);
    let warm_up = run / 6;
    let mut samples: Vec<(u64, u64, usize)> = Vec::new();
    let mut generation = 0;
    let mut restarts = 0;
    let mut next_restart = Duration::from_secs(60);
    while started.elapsed() < run {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let at = started.elapsed();
        generation += 1;
        let keys = dir.path().join("keys.toml");
        let tmp = dir.path().join("keys.toml.new");
        std::fs::write(&tmp, keys_file(generation)).expect("keys");
        std::fs::rename(&tmp, &keys).expect("rename");
        if at >= next_restart {
            next_restart += Duration::from_secs(60);
            let which = restarts % 2;
            let _ = mocks[which].kill();
            let _ = mocks[which].wait();
            tokio::time::sleep(Duration::from_secs(2)).await;
            mocks[which] = mock(&bin, ups[which]);
            restarts += 1;
        }
        let (rss, fds) = usage_of(pid);
        samples.push((at.as_secs(), rss, fds));
        println!(
            "soak: {:>5} s  rss {:>7} KiB  fds {:>4}  requests {:>9}",
            at.as_secs(),
            rss,
            fds,
            counts.authed.load(Ordering::Relaxed)
        );
    }
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    let (end_rss, end_fds) = usage_of(pid);

    // Stop the gateway: every record is written before it exits.
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = gateway.wait().expect("wait");
    for m in mocks.iter_mut() {
        let _ = m.kill();
        let _ = m.wait();
    }
    let log = log.join().unwrap_or_default();
    let db = rusqlite::Connection::open(dir.path().join("usage.db")).expect("db");
    let records: i64 = db
        .query_row("SELECT COUNT(*) FROM usage", [], |r| r.get(0))
        .expect("count");
    let records = records as u64;
    let by_status: Vec<(i64, i64)> = db
        .prepare("SELECT status, COUNT(*) FROM usage GROUP BY status ORDER BY status")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()
        })
        .expect("statuses");

    let after: Vec<_> = samples
        .iter()
        .filter(|(t, _, _)| *t >= warm_up.as_secs())
        .collect();
    let base_rss = after.first().map_or(0, |s| s.1);
    let max_rss = after.iter().map(|s| s.1).max().unwrap_or(0);
    let base_fds = after.first().map_or(0, |s| s.2);
    let max_fds = after.iter().map(|s| s.2).max().unwrap_or(0);
    let authed = counts.authed.load(Ordering::Relaxed);
    let cut: u64 = counts
        .by
        .lock()
        .await
        .iter()
        .filter(|((_, o), _)| o == "cut")
        .map(|(_, n)| n)
        .sum();
    let recorded_502 = by_status
        .iter()
        .find(|(s, _)| *s == 502)
        .map_or(0, |(_, n)| *n as u64);
    let unanswered = counts.unanswered.load(Ordering::Relaxed);
    let unexplained: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .filter(|l| !explained(l))
        .collect();

    println!("\n== soak summary: {} s, {WORKERS} workers", run.as_secs());
    for ((kind, outcome), n) in counts.by.lock().await.iter() {
        println!("  {kind:<10} {outcome:<6} {n:>9}");
    }
    println!("  records by status: {by_status:?}");
    println!(
        "  RSS after warm-up ({} s): {base_rss} KiB, max {max_rss} KiB ({:+.1}%), at the end {end_rss} KiB",
        warm_up.as_secs(),
        (max_rss as f64 / base_rss.max(1) as f64 - 1.0) * 100.0
    );
    println!("  fds after warm-up {base_fds}, max {max_fds}, at the end {end_fds}");
    println!("  requests that passed auth {authed}, records {records}, unanswered {unanswered}");
    println!(
        "  keys reloads {generation}, upstream restarts {restarts}, gateway exit {status}, \
         log lines at warn/error {} (unexplained {})",
        log.lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .count(),
        unexplained.len()
    );
    let mut failed = Vec::new();
    if max_rss as f64 > base_rss as f64 * 1.10 {
        failed.push("RSS grew more than 10% after warm-up".to_string());
    }
    if max_fds > base_fds + 16 {
        failed.push(format!("fds grew from {base_fds} to {max_fds}"));
    }
    if unanswered > 0 {
        failed.push(format!("{unanswered} requests unanswered"));
    }
    println!("  replies cut by an upstream's death {cut} (502 records: {recorded_502})");
    if cut > recorded_502 {
        failed.push(format!(
            "{cut} replies cut but {recorded_502} recorded as 502"
        ));
    }
    if records != authed {
        failed.push(format!("{records} records for {authed} requests"));
    }
    if !status.success() {
        failed.push(format!("the gateway exited with {status}"));
    }
    for l in unexplained.iter().take(10) {
        println!("  unexplained: {l}");
    }
    if !unexplained.is_empty() {
        failed.push(format!("{} unexplained log lines", unexplained.len()));
    }
    if failed.is_empty() {
        println!("== soak passed");
    } else {
        println!("== soak FAILED: {}", failed.join("; "));
        std::process::exit(1);
    }
}
