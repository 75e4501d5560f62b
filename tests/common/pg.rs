//! A real Postgres server for a test: Debian's `postgresql` binaries, a fresh cluster in a
//! temp dir on a free loopback port, stopped (immediately) when the handle drops. Run as the
//! `postgres` user when the tests run as root (initdb refuses root). `fsync` is off (the
//! machine does not crash mid-test) but commits stay synchronous: a test that kills the server
//! must not lose what it acknowledged.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub struct Postgres {
    pub dir: tempfile::TempDir,
    pub port: u16,
    bin: PathBuf,
    /// Some("postgres") when commands must run as that user.
    user: Option<String>,
}

/// The folder holding initdb and pg_ctl (Debian puts them out of PATH), if installed.
fn find_bindir() -> Option<PathBuf> {
    if let Ok(o) = Command::new("pg_config").arg("--bindir").output() {
        let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        if p.join("initdb").exists() {
            return Some(p);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
    found.pop()
}

fn bindir() -> PathBuf {
    find_bindir().expect("Debian's postgresql is installed (scripts/install-deps.sh --test)")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Postgres {
    /// Whether Postgres is here to start (else the test is skipped: `super::needs`).
    pub fn installed() -> bool {
        super::needs("postgresql", find_bindir().is_some())
    }

    /// A started server, or None (the test skipped) where Postgres is not installed.
    pub fn start_or_skip() -> Option<Postgres> {
        Self::installed().then(Self::start)
    }

    pub fn start() -> Postgres {
        Postgres::start_with(None)
    }

    /// A server that takes TLS connections only, with this certificate and key (PEM).
    pub fn start_tls(cert: &Path, key: &Path) -> Postgres {
        Postgres::start_with(Some((cert, key)))
    }

    fn start_with(tls: Option<(&Path, &Path)>) -> Postgres {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = is_root().then(|| "postgres".to_string());
        if user.is_some() {
            let st = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(st.success(), "chown the cluster's folder to postgres");
        }
        let pg = Postgres {
            port: super::free_port(),
            bin: bindir(),
            user,
            dir,
        };
        let data = pg.data();
        let out = pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().expect("utf-8 path"),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             fsync = off\nfull_page_writes = off\nmax_connections = 200\n",
            pg.port,
            pg.dir.path().display()
        );
        if let Some((cert, key)) = tls {
            std::fs::copy(cert, data.join("server.crt")).expect("cert");
            std::fs::copy(key, data.join("server.key")).expect("key");
            conf.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
            // TCP without TLS is refused: whoever gets in, got in over TLS.
            let hba = std::fs::read_to_string(data.join("pg_hba.conf")).expect("pg_hba");
            std::fs::write(
                data.join("pg_hba.conf"),
                format!("hostnossl all all all reject\n{hba}"),
            )
            .expect("pg_hba");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                data.join("server.key"),
                std::fs::Permissions::from_mode(0o600),
            )
            .expect("chmod");
        }
        std::fs::write(data.join("postgresql.auto.conf"), conf).expect("postgresql.auto.conf");
        if pg.user.is_some() {
            let st = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&data)
                .status()
                .expect("chown");
            assert!(st.success());
        }
        pg.up();
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let exe = self.bin.join(tool);
        let mut cmd = match &self.user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(args).output().expect("run a postgres tool")
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A client for checks; use it off the async runtime (`off_runtime`): the sync client
    /// runs a runtime of its own.
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url(), postgres::NoTls)
            .expect("connect to the test postgres")
    }

    /// Starts the server and waits until it takes connections.
    pub fn up(&self) {
        let data = self.data();
        let log = self.dir.path().join("server.log");
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().expect("utf-8"),
                "-l",
                log.to_str().expect("utf-8"),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        // Over the socket, which takes no TLS: the server is up whatever it asks of TCP.
        let url = format!(
            "host={} port={} user=postgres dbname=postgres",
            self.dir.path().display(),
            self.port
        );
        off_runtime(move || {
            super::eventually(
                Duration::from_secs(30),
                "postgres not taking connections",
                || {
                    postgres::Client::connect(&url, postgres::NoTls)
                        .map(drop)
                        .map_err(|e| e.to_string())
                },
            );
        });
    }

    /// Stops the server the hard way (as a crash or a kill would).
    pub fn down(&self) {
        let data = self.data();
        let _ = self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().expect("utf-8"),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.down();
    }
}

/// Runs `f` on a thread of its own: the sync Postgres client cannot run on an async runtime's
/// thread.
pub fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("thread"))
}
