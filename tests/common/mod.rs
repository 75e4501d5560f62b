//! Test harness: starts the real `modelgate` binary on free loopback ports with a temp config,
//! the mock upstream in-process (`[demo] mock_upstream`), and talks HTTP to it. The process
//! is killed when the handle drops.
#![allow(dead_code)]

pub mod pg;
pub mod pki;
pub mod redis;

use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const KEY: &str = "sk-test-full-access-0001";
pub const ECHO_ONLY_KEY: &str = "sk-test-echo-only-0002";
pub const MODELS_ONLY_KEY: &str = "sk-test-models-only-0003";
pub const DISABLED_KEY: &str = "sk-test-disabled-0004";
pub const EXPIRED_KEY: &str = "sk-test-expired-0005";
pub const POOL_KEY: &str = "sk-upstream-pool-secret";
pub const BUDGET_KEY: &str = "sk-test-budgeted-0006";
pub const OTHER_KEY: &str = "sk-test-other-tenant-0007";
pub const RPM100_KEY: &str = "sk-test-rpm100-0008";
pub const RPM2_KEY: &str = "sk-test-rpm2-0009";
pub const TPM_KEY: &str = "sk-test-tpm-0010";
pub const CONC_KEY: &str = "sk-test-conc-0011";

/// Whether a Debian package a test needs (`postgresql`, `redis-server`) is `found`. Where it
/// is not, the test says it was skipped and why, and passes, so `cargo test` runs on a laptop
/// with only Rust and a C compiler; with `MODELGATE_TEST_REQUIRE_ALL` set (`scripts/test.sh`
/// and CI set it) the test fails instead.
pub fn needs(package: &str, found: bool) -> bool {
    if found {
        return true;
    }
    let why = format!("{package} is not installed (scripts/install-deps.sh --test installs it)");
    assert!(
        std::env::var_os("MODELGATE_TEST_REQUIRE_ALL").is_none(),
        "{why}, and MODELGATE_TEST_REQUIRE_ALL is set"
    );
    eprintln!("skipped: {why}");
    false
}

/// The pause before `eventually`'s second look: 10 ms, doubled after each look up to `POLL_MAX`
/// (quick for what comes at once, and no flood of requests on what takes seconds: a key's usage
/// calls are bounded per second).
const POLL_FIRST: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(50);

/// Waits for a condition: runs `check` (at once, then every 10 to 50 ms) until it returns `Ok`,
/// and returns that. `check` returns `Err` with what it saw (the last state, for the failure
/// message; empty where there is nothing to tell) while the condition does not hold yet.
/// Panics with `what` (say what did not happen) and the last `Err` once `within` has passed;
/// `check` runs at least once.
#[track_caller]
pub fn eventually<T>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    let mut pause = POLL_FIRST;
    loop {
        match check() {
            Ok(v) => return v,
            Err(last) => {
                if Instant::now() >= deadline {
                    give_up(within, what, &last);
                }
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(POLL_MAX);
    }
}

/// `eventually` for an async `check` (`async || ...` or `|| async ...`): sleeps on the tokio
/// timer between polls.
pub async fn eventually_async<T>(
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    let mut pause = POLL_FIRST;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => {
                if Instant::now() >= deadline {
                    give_up(within, what, &last);
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(POLL_MAX);
    }
}

#[track_caller]
fn give_up(within: Duration, what: &str, last: &str) -> ! {
    if last.is_empty() {
        panic!("{what} (waited {within:?})");
    }
    panic!("{what} (waited {within:?}; last: {last})");
}

pub struct Gateway {
    child: Child,
    /// Everything the gateway wrote to stderr, read as it comes (a full pipe would block it).
    stderr: Option<std::thread::JoinHandle<String>>,
    ports: Ports,
    /// The demo mock's port and the dead one, held for the gateway's life (`hold_port`).
    held: std::sync::Arc<[socket2::Socket; 2]>,
    env: Vec<(String, String)>,
    pub main: String,
    pub direct: String,
    pub admin: String,
    pub mock: String,
    pub dir: tempfile::TempDir,
}

impl Drop for Gateway {
    /// Kills the gateway; when a test failed, what it wrote to stderr (warnings and errors)
    /// goes to the test's output, to tell a gateway's fault from the test's.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let status = self.child.wait();
        if std::thread::panicking() {
            if let Some(Ok(err)) = self.stderr.take().map(|t| t.join()) {
                eprintln!("gateway ({status:?}) stderr:\n{err}");
            }
        }
    }
}

/// A loopback port nothing listens on now, and never one handed out before in this test
/// process. Each port is released before its user binds it, so two picks can come back equal
/// (the kernel may offer a just-released port again); a gateway whose `main` and mock ports
/// were the same had its demo mock answer on `main` (a CI flake: 200 for an unknown model).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// A raw TCP connection to a gateway base URL (`http://127.0.0.1:PORT`), for requests an
/// HTTP client will not send as they are.
pub async fn raw_connect(base: &str) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .expect("connect")
}

/// Reads a `raw_connect` socket until what came satisfies `done`, each read within `within`;
/// the connection closing first fails the test.
pub async fn read_raw_until(
    s: &mut tokio::net::TcpStream,
    within: Duration,
    done: impl Fn(&[u8]) -> bool,
) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    while !done(&got) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(within, s.read(&mut chunk))
            .await
            .expect("more of the reply in time")
            .expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    got
}

/// A blocking TCP connection to a gateway base URL, each read waiting at most `read_timeout`:
/// for what an HTTP client's pool hides (a kept-alive connection's idle time, a trickled
/// header).
pub fn blocking_connect(base: &str, read_timeout: Duration) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(base.trim_start_matches("http://")).expect("connect");
    s.set_read_timeout(Some(read_timeout)).expect("timeout");
    s
}

/// Sends `GET /v1/models` with the test key on `s` and returns the reply's first read as text,
/// leaving the connection open.
pub fn models_over(s: &mut std::net::TcpStream) -> String {
    let req = format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    std::io::Write::write_all(s, req.as_bytes()).expect("write");
    let mut buf = [0u8; 65536];
    let n = s.read(&mut buf).expect("reply");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The `x-request-id` of a reply.
pub fn request_id(resp: &reqwest::Response) -> String {
    resp.headers()["x-request-id"]
        .to_str()
        .expect("ascii")
        .to_string()
}

/// The `x-request-id` of a reply read off a `raw_connect` socket (its text as it came).
pub fn request_id_in(raw: &str) -> String {
    raw.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-request-id")
                .then(|| value.trim().to_string())
        })
        .expect("x-request-id")
}

/// The head of a JSON chat completion request to send over `raw_connect`: `key` as the bearer,
/// a body of `len` bytes, and `extra` header lines (each ending in `\r\n`).
pub fn chat_head(key: &str, len: usize, extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n{extra}\r\n"
    )
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_modelgate"))
}

pub const KEYS: &str = r#"
[[keys]]
id = "full"
secret = "sk-test-full-access-0001"

[[keys]]
id = "echo-only"
secret = "sk-test-echo-only-0002"
models = ["echo-*"]

[[keys]]
id = "models-only"
secret_sha256 = "SHA_OF_MODELS_ONLY"
endpoints = ["models"]

[[keys]]
id = "disabled"
secret = "sk-test-disabled-0004"
disabled = true

[[keys]]
id = "expired"
secret = "sk-test-expired-0005"
expires_at = "2020-01-01T00:00:00Z"

[[keys]]
id = "budgeted"
secret = "sk-test-budgeted-0006"
budget = 10.0

[[keys]]
id = "other"
secret = "sk-test-other-tenant-0007"

[[keys]]
id = "rpm100"
secret = "sk-test-rpm100-0008"
rpm = 100

[[keys]]
id = "rpm2"
secret = "sk-test-rpm2-0009"
rpm = 2

[[keys]]
id = "tpm"
secret = "sk-test-tpm-0010"
tpm = 20

[[keys]]
id = "conc"
secret = "sk-test-conc-0011"
max_concurrent = 2
"#;

/// Options a test may change.
pub struct Setup {
    /// Appended to the config; `@MOCK@` and `@DEAD@` become the mock's and a dead port.
    pub extra_config: String,
    pub read_timeout_ms: u64,
    pub max_body_bytes: usize,
    /// `[server] grace_period_seconds`.
    pub grace_seconds: u64,
    /// More `[server]` lines.
    pub server_extra: String,
    /// Extra environment for the gateway process.
    pub env: Vec<(String, String)>,
    /// Appended to the keys file.
    pub extra_keys: String,
    /// More `[limits]` lines.
    pub limits_extra: String,
    /// More `[keys]` lines.
    pub keys_extra: String,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            extra_config: String::new(),
            read_timeout_ms: 30_000,
            max_body_bytes: 25 * 1024 * 1024,
            grace_seconds: 1,
            server_extra: String::new(),
            env: Vec::new(),
            extra_keys: String::new(),
            limits_extra: String::new(),
            keys_extra: String::new(),
        }
    }
}

pub fn start() -> Gateway {
    start_with(Setup::default())
}

/// Starts a gateway whose listeners are on ports it picks itself (port 0; it says which on
/// stderr), with its demo mock and the dead upstream on ports this process picked and holds
/// (`hold_port`): no port is released for another process to take before the gateway binds it.
pub fn start_with(setup: Setup) -> Gateway {
    let dir = tempfile::tempdir().expect("tmp");
    let (mock, mock_held) = hold_port(true);
    let (dead, dead_held) = hold_port(false);
    let ports = (0, 0, 0, mock, dead);
    write_config(dir.path(), &setup, ports).expect("config");
    let held = std::sync::Arc::new([mock_held, dead_held]);
    spawn(dir, &setup, ports, held).unwrap_or_else(|e| panic!("gateway did not start: {e}"))
}

/// A loopback port picked by the system and held by a socket bound to it and never listening:
/// nobody else gets it, and a connection to it is refused. With `reuse_port`, a server that
/// binds it with `SO_REUSEPORT` (the gateway's demo mock) takes it over while it is held.
pub fn hold_port(reuse_port: bool) -> (u16, socket2::Socket) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_reuse_port(reuse_port).expect("SO_REUSEPORT");
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("address");
    socket.bind(&any.into()).expect("bind");
    let port = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .expect("port");
    (port, socket)
}

type Ports = (u16, u16, u16, u16, u16);

fn write_config(path: &std::path::Path, setup: &Setup, ports: Ports) -> Result<(), String> {
    let (main, direct, admin, mock, dead) = ports;
    let config = format!(
        r#"
[listeners]
main = "127.0.0.1:{main}"
direct = "127.0.0.1:{direct}"
admin = "127.0.0.1:{admin}"

[keys]
file = "keys.toml"
{keys_extra}

[limits]
max_body_bytes = {max_body}
{limits_extra}

[server]
threads = 1
grace_period_seconds = {grace}
{server_extra}

[demo]
mock_upstream = "127.0.0.1:{mock}"

[[pools]]
pass_headers = ["x-mock-*"]   # the mock's echo of what it was sent, which tests read
name = "local"
upstreams = ["http://127.0.0.1:{mock}"]
api_key = "{POOL_KEY}"
read_timeout_ms = {read_timeout}

[[pools]]
pass_headers = ["x-mock-*"]
name = "dead"
upstreams = ["http://127.0.0.1:{dead}"]
connect_timeout_ms = 2000
health_interval_ms = 0      # only requests find it dead (tests/errors.rs counts on that)

[[models]]
name = "echo-1"
pool = "local"

[[models]]
name = "big-model"
pool = "local"
upstream_model = "upstream/big-model-v2"

[[models]]
name = "gone-model"
pool = "dead"

[[models]]
name = "priced-model"
pool = "local"
upstream_model = "echo-1"
price = {{ prompt = 1000000.0, completion = 1000000.0, request = 0.5 }}
{extra}
"#,
        max_body = setup.max_body_bytes,
        grace = setup.grace_seconds,
        server_extra = setup.server_extra,
        limits_extra = setup.limits_extra,
        keys_extra = setup.keys_extra,
        read_timeout = setup.read_timeout_ms,
        extra = setup
            .extra_config
            .replace("@MOCK@", &mock.to_string())
            .replace("@DEAD@", &dead.to_string()),
    );
    std::fs::write(path.join("modelgate.toml"), config).map_err(|e| e.to_string())?;
    let keys = KEYS.replace(
        "SHA_OF_MODELS_ONLY",
        &sha256_hex(MODELS_ONLY_KEY.as_bytes()),
    ) + &setup.extra_keys;
    std::fs::write(path.join("keys.toml"), keys).map_err(|e| e.to_string())?;
    Ok(())
}

/// The ports a gateway's `listening: main=… direct=… admin=…` line names.
fn listening(line: &str) -> Option<(u16, u16, u16)> {
    let port = |name: &str| -> Option<u16> {
        let word = line
            .split(' ')
            .find_map(|w| w.strip_prefix(&format!("{name}=")))?;
        word.rsplit(':').next()?.parse().ok()
    };
    Some((port("main")?, port("direct")?, port("admin")?))
}

fn spawn(
    dir: tempfile::TempDir,
    setup: &Setup,
    ports: Ports,
    held: std::sync::Arc<[socket2::Socket; 2]>,
) -> Result<Gateway, String> {
    let (_, _, _, mock, dead) = ports;
    let mut child = Command::new(bin())
        .args(["serve", "--config"])
        .arg(dir.path().join("modelgate.toml"))
        .env("RUST_LOG", "warn")
        .envs(setup.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Its stderr is read as it comes (a full pipe would block it): lines to this thread until
    // the one naming the ports, and all of it at the end.
    let pipe = child.stderr.take().ok_or("no stderr")?;
    let (lines, told) = std::sync::mpsc::channel::<String>();
    let stderr = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        let mut reader = std::io::BufReader::new(pipe);
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            let _ = lines.send(line.clone());
            all.push_str(&line);
            line.clear();
        }
        all
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let gone = |child: &mut Child, stderr: std::thread::JoinHandle<String>, why: String| {
        let _ = child.kill();
        let _ = child.wait();
        format!("{why}: {}", stderr.join().unwrap_or_default())
    };
    // Ports it picks (0 in the config) are said on a line; a restart's are in its config.
    let (main, direct, admin) = loop {
        if ports.0 != 0 {
            break (ports.0, ports.1, ports.2);
        }
        match told.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => match line
                .trim_end()
                .strip_prefix("listening: ")
                .and_then(listening)
            {
                Some(ports) => break ports,
                None => continue,
            },
            Err(_) => return Err(gone(&mut child, stderr, "no ports said within 30 s".into())),
        }
    };
    // Said before it binds them: ready once all answer. A connection to itself (the kernel
    // may give a connect to a port nothing listens on that very port as its source) is not
    // the gateway listening.
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(gone(&mut child, stderr, format!("exited with {status}")));
        }
        let up = [main, direct, admin, mock].iter().all(|p| {
            std::net::TcpStream::connect(("127.0.0.1", *p))
                .is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
        });
        if up {
            break;
        }
        if Instant::now() > deadline {
            return Err(gone(&mut child, stderr, "not listening after 30 s".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Gateway {
        main: format!("http://127.0.0.1:{main}"),
        direct: format!("http://127.0.0.1:{direct}"),
        admin: format!("http://127.0.0.1:{admin}"),
        mock: format!("http://127.0.0.1:{mock}"),
        ports: (main, direct, admin, mock, dead),
        held,
        env: setup.env.clone(),
        child,
        stderr: Some(stderr),
        dir,
    })
}

/// The config in `dir` with its listeners' port 0 replaced by the ports given.
fn pin_ports(dir: &std::path::Path, ports: Ports) {
    let config = dir.join("modelgate.toml");
    let (main, direct, admin, _, _) = ports;
    let mut text = std::fs::read_to_string(&config).expect("config");
    for (name, port) in [("main", main), ("direct", direct), ("admin", admin)] {
        text = text.replacen(
            &format!("{name} = \"127.0.0.1:0\""),
            &format!("{name} = \"127.0.0.1:{port}\""),
            1,
        );
    }
    std::fs::write(&config, text).expect("config");
}

impl Gateway {
    /// The port nothing listens on (`@DEAD@` in `extra_config`).
    pub fn dead_port(&self) -> u16 {
        self.ports.4
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, as an orchestrator stops it; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal("-TERM")
    }

    /// Sends a signal (`-TERM`, `-INT`, …) and waits for the process to exit.
    pub fn signal(&mut self, sig: &str) -> std::process::ExitStatus {
        self.send_signal(sig);
        self.wait()
    }

    /// Sends a signal (`-TERM`, `-INT`, …) without waiting.
    pub fn send_signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args([sig, &pid]).status();
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait")
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    /// Stops it with SIGTERM and starts it again on the same folder (same store) and ports.
    pub fn restart(mut self) -> Gateway {
        let status = self.terminate();
        assert!(status.success(), "exit after SIGTERM: {status}");
        self.restart_stopped()
    }

    /// Starts a terminated gateway again on the same folder and ports (its listeners' ports
    /// written into its config: the ones it picked are free again, and taken back at once).
    pub fn restart_stopped(mut self) -> Gateway {
        let dir = tempfile::tempdir().expect("tmp");
        let old = std::mem::replace(&mut self.dir, dir);
        let setup = Setup {
            env: self.env.clone(),
            ..Setup::default()
        };
        pin_ports(old.path(), self.ports);
        spawn(old, &setup, self.ports, self.held.clone()).expect("restart")
    }

    /// Writes the ports the gateway picked into its config (for another instance to take its
    /// listeners over in an upgrade, which finds them by address).
    pub fn pin_ports(&self) {
        pin_ports(self.dir.path(), self.ports);
    }

    pub fn bases(&self) -> [String; 2] {
        [self.main.clone(), self.direct.clone()]
    }

    /// Drains the gateway's stderr so far (the process must have exited).
    pub fn stop_and_stderr(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }

    /// Everything the gateway wrote to stderr (the process must have exited).
    pub fn take_stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }

    /// SIGTERM, then everything the gateway wrote to stderr.
    pub fn terminate_and_stderr(mut self) -> (std::process::ExitStatus, String) {
        let status = self.terminate();
        let err = self
            .stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        (status, err)
    }
}

pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

pub fn chat_body(model: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "say hello to me"}]})
}

/// POSTs JSON with a key (if any) and extra headers; the response, unread.
pub async fn send(
    base: &str,
    path: &str,
    key: Option<&str>,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = client().post(format!("{base}{path}"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.json(body).send().await.expect("send")
}

/// GETs with a key (if any); the response, unread.
pub async fn get(base: &str, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut req = client().get(format!("{base}{path}"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().await.expect("send")
}

/// POSTs JSON with the full-access key.
pub async fn post_json(base: &str, path: &str, body: &serde_json::Value) -> reqwest::Response {
    send(base, path, Some(KEY), body, &[]).await
}

/// The error object of a gateway error reply, checking shape and content type.
pub async fn error_of(resp: reqwest::Response) -> (u16, serde_json::Value) {
    let status = resp.status().as_u16();
    assert!(
        resp.headers().contains_key("x-request-id"),
        "no x-request-id on {status}"
    );
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_string())
        .unwrap_or_default();
    assert!(ct.starts_with("application/json"), "content-type {ct}");
    let v: serde_json::Value = resp.json().await.expect("json error body");
    let e = v
        .get("error")
        .cloned()
        .unwrap_or_else(|| panic!("no error object in {v}"));
    for f in ["message", "type", "param", "code"] {
        assert!(e.get(f).is_some(), "error lacks {f}: {v}");
    }
    (status, e)
}

/// The mock's reply text for the default 8 chunks.
pub const MOCK_TEXT: &str = "Hello from the mock café naïve ✓ 日本語";

/// A standalone `modelgate mock-upstream` process, killed on drop.
pub struct MockProcess {
    child: Child,
    pub port: u16,
}

impl Drop for MockProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_mock(extra_args: &[&str]) -> MockProcess {
    start_mock_at(free_port(), extra_args)
}

/// A mock on a given port (to bring back one that was stopped).
pub fn start_mock_at(port: u16, extra_args: &[&str]) -> MockProcess {
    let child = Command::new(bin())
        .args(["mock-upstream", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra_args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mock");
    eventually(Duration::from_secs(30), "mock did not listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .map(drop)
            .map_err(|e| e.to_string())
    });
    MockProcess { child, port }
}

/// The record of a request, found by its `x-request-id` on the usage API (records are written
/// in batches: this waits for it, up to 5 s).
pub async fn await_record(g: &Gateway, request_id: &str) -> serde_json::Value {
    await_record_via(&client(), &g.direct, request_id).await
}

/// `await_record` through a given client and `direct` base URL (an HTTPS one, say).
pub async fn await_record_via(
    client: &reqwest::Client,
    direct: &str,
    request_id: &str,
) -> serde_json::Value {
    await_record_within(client, direct, request_id, Duration::from_secs(5)).await
}

/// `await_record_via`, waiting up to `within` (a record whose estimate is slow to count), among
/// the newest 1,000 records.
pub async fn await_record_within(
    client: &reqwest::Client,
    direct: &str,
    request_id: &str,
    within: Duration,
) -> serde_json::Value {
    await_key_record(client, direct, KEY, request_id, within).await
}

/// Every record of `key` on the gateway at `direct`, newest first, read page by page.
pub async fn all_records(direct: &str, key: &str) -> Vec<serde_json::Value> {
    let mut data = Vec::new();
    let mut url = format!("{direct}/api/usage?limit=1000");
    let client = client();
    loop {
        let page = usage_page(&client, &url, key).await;
        data.extend(page["data"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(c) if !c.is_empty() => url = format!("{direct}/api/usage?limit=1000&cursor={c}"),
            _ => return data,
        }
    }
}

/// One page of `/api/usage` at `url`, read with `key`.
async fn usage_page(client: &reqwest::Client, url: &str, key: &str) -> serde_json::Value {
    client
        .get(url)
        .bearer_auth(key)
        .send()
        .await
        .expect("usage")
        .json()
        .await
        .expect("json")
}

/// `await_record_within` among the records of `key`.
pub async fn await_key_record(
    client: &reqwest::Client,
    direct: &str,
    key: &str,
    request_id: &str,
    within: Duration,
) -> serde_json::Value {
    let what = format!("no record {request_id}");
    await_record_where(client, direct, key, within, &what, |r| {
        r["request_id"] == request_id
    })
    .await
}

/// The newest of `key`'s records (among its newest 1,000) that `matches`, once there is one;
/// panics with `what` after `within`.
pub async fn await_record_where(
    client: &reqwest::Client,
    direct: &str,
    key: &str,
    within: Duration,
    what: &str,
    matches: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    eventually_async(within, what, async || {
        let url = format!("{direct}/api/usage?limit=1000&order=desc");
        let page = usage_page(client, &url, key).await;
        page["data"]
            .as_array()
            .and_then(|d| d.iter().find(|r| matches(r)))
            .cloned()
            .ok_or_else(String::new)
    })
    .await
}

/// A key's spend, as the balance endpoint tells it.
pub async fn spend_of(g: &Gateway, key: &str) -> f64 {
    let v: serde_json::Value = get(&g.main, "/v1/dashboard/billing/subscription", Some(key))
        .await
        .json()
        .await
        .expect("json");
    v["modelgate"]["spend"].as_f64().expect("spend")
}

/// The admin listener's `/metrics` text.
pub async fn metrics_text(g: &Gateway) -> String {
    reqwest::get(format!("{}/metrics", g.admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// The value of the first series on the admin listener's `/metrics` whose line starts with
/// `prefix` (name and labels), or 0.
pub async fn metric_value(g: &Gateway, prefix: &str) -> f64 {
    metrics_text(g)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A pool of two upstreams that refuse connections (health checks off), for `all-dead-model`.
pub const ALL_DEAD_POOL: &str = r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "all-dead"
upstreams = ["http://127.0.0.1:@DEAD@", "http://127.0.0.1:1"]
health_interval_ms = 0
retry_base_ms = 10

[[models]]
name = "all-dead-model"
pool = "all-dead"
"#;

/// Sends `request` and reads up to the first piece of its 200 reply, then no more: returns the
/// connection (to keep it open) and the reply's request id.
pub fn stop_reading_after_the_header(base: &str, request: &str) -> (std::net::TcpStream, String) {
    let mut s = blocking_connect(base, Duration::from_secs(20));
    std::io::Write::write_all(&mut s, request.as_bytes()).expect("request");
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).expect("reply");
    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let id = request_id_in(&head);
    (s, id)
}

/// Reads a chunked reply off `s` up to its last chunk (nothing after it): its bytes.
pub fn read_until_last_chunk(s: &mut std::net::TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"\r\n0\r\n\r\n") {
        let n = s.read(&mut buf).expect("reply");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// Writes `n` records of the test key (`full`) straight into the gateway's store, ending
/// `before_ms` before now: a CSV export of about 140 bytes a record.
pub fn seed_records(g: &Gateway, n: i64, before_ms: i64) {
    use modelgate::store::{Store, StoreOptions, UsageRecord};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let store = Store::open(&g.dir.path().join("usage.db"), StoreOptions::default()).expect("db");
    for i in 0..n {
        store.record(UsageRecord {
            time_ms: now - before_ms - n + i,
            request_id: format!("req_seeded_{i:08}"),
            key_id: "full".into(),
            listener: "direct".into(),
            endpoint: "chat".into(),
            model: "echo-1".into(),
            status: 200,
            stream: false,
            prompt_tokens: 12,
            completion_tokens: 34,
            total_tokens: 46,
            cost: 0.25,
            latency_ms: 17,
            ttft_ms: None,
            upstream: "http://127.0.0.1:9100".into(),
            estimated: false,
            attempts: 1,
            served_model: "echo-1".into(),
            cut: String::new(),
            ..Default::default()
        });
    }
    store.close();
}
