//! A real Redis server for a test: Debian's `redis-server` on a free loopback port with no
//! persistence, in a temp dir; killed when the handle drops, and restartable on the same port.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Redis {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
    /// (cert, key, CA) when it takes TLS connections only.
    tls: Option<(String, String, String)>,
}

impl Redis {
    /// Whether Redis is here to start (else the test is skipped: `super::needs`).
    pub fn installed() -> bool {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok();
        super::needs("redis-server", found)
    }

    /// A started server, or None (the test skipped) where Redis is not installed.
    pub fn start_or_skip() -> Option<Redis> {
        Self::installed().then(Self::start)
    }

    pub fn start() -> Redis {
        let mut r = Redis {
            dir: tempfile::tempdir().expect("tempdir"),
            port: super::free_port(),
            child: None,
            tls: None,
        };
        r.up();
        r
    }

    /// A server that takes TLS connections only (`rediss://`), with this certificate, key and CA.
    pub fn start_tls(cert: &str, key: &str, ca: &str) -> Redis {
        let mut r = Redis {
            dir: tempfile::tempdir().expect("tempdir"),
            port: super::free_port(),
            child: None,
            tls: Some((cert.into(), key.into(), ca.into())),
        };
        r.up();
        r
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) and waits until it answers PING.
    pub fn up(&mut self) {
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            None => cmd.args(["--port", &self.port.to_string()]),
            Some((cert, key, ca)) => cmd
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .args([
                    "--tls-cert-file",
                    cert,
                    "--tls-key-file",
                    key,
                    "--tls-ca-cert-file",
                    ca,
                ])
                .args(["--tls-auth-clients", "no"]),
        };
        let child = cmd
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server; scripts/install-deps.sh --test)");
        self.child = Some(child);
        super::eventually(
            Duration::from_secs(20),
            "redis-server did not answer",
            || {
                let pong = match &self.tls {
                    None => redis::Client::open(self.url())
                        .and_then(|c| c.get_connection())
                        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                        .is_ok(),
                    Some((_, _, ca)) => Command::new("redis-cli")
                        .args([
                            "--tls",
                            "--cacert",
                            ca,
                            "-p",
                            &self.port.to_string(),
                            "ping",
                        ])
                        .output()
                        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG")),
                };
                if pong { Ok(()) } else { Err(String::new()) }
            },
        );
    }

    /// Kills the server (as a crash would); its data is gone.
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends the server a signal (`-STOP` freezes it: connections stay open, nothing is
    /// answered; `-CONT` resumes it).
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
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
