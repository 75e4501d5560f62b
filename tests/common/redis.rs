//! A real Redis server for a test: Debian's `redis-server` on a free loopback port with no
//! persistence, in a temp dir; killed when the handle drops, and restartable on the same port.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
}

impl Redis {
    pub fn start() -> Redis {
        let mut r = Redis {
            dir: tempfile::tempdir().expect("tempdir"),
            port: super::free_port(),
            child: None,
        };
        r.up();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) and waits until it answers PING.
    pub fn up(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server; scripts/install-deps.sh --test)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pong = redis::Client::open(self.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if pong.is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not answer");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (as a crash would); its data is gone.
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A synchronous client for checks (use it off the async runtime's threads or briefly).
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to the test redis")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.down();
    }
}
