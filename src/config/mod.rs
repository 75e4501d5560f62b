//! Config stage: read `modelgate.toml` → deserialize strictly (`deny_unknown_fields`) →
//! validate → typed `Config`. Every problem found names file, line and field; loading never
//! stops at the first one. Relative paths resolve against the config file's folder.

pub mod headers;
pub mod keys;
pub mod keys_db;
pub mod keys_file;
pub mod live;
mod problem;
pub mod reload;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub use problem::{Problem, Problems};

/// A credential sent upstream. Debug never shows it and it is never serialized.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub listeners: Listeners,
    pub keys_file: PathBuf,
    /// `[keys] source = "postgres"`: the keys live in the Postgres store's `keys` table
    /// (`keys_file` is then only the default of `keys import`).
    pub keys_in_postgres: bool,
    /// The usage store (default `usage.db` beside the config file).
    pub sqlite: PathBuf,
    /// The fleet's store instead of `sqlite`: a `postgres://…` URL or `key=value` settings.
    pub postgres: Option<Secret>,
    /// Where records wait on disk while Postgres is away (default `usage-spool.jsonl` beside
    /// the config file).
    pub spool: PathBuf,
    /// Usage records older than this are deleted; None keeps them forever.
    pub retention: Option<Duration>,
    pub pools: Vec<PoolConfig>,
    pub models: Vec<ModelConfig>,
    pub demo_mock_upstream: Option<String>,
    pub max_body_bytes: usize,
    pub console: Option<ConsoleConfig>,
    pub threads: usize,
    pub grace_period_seconds: u64,
    /// `[server] shutdown_delay_ms`: after SIGTERM or SIGINT, how long the listeners stay open,
    /// draining (`/readyz` 503, replies closing their connections), before the shutdown proper.
    pub shutdown_delay: Duration,
    /// Where a process started with `--upgrade` takes the listening sockets over from this
    /// one (default `modelgate-upgrade.sock` beside the config file).
    pub upgrade_sock: PathBuf,
    /// `[server] trusted_proxies`: peers whose `X-Forwarded-For` names the client (see
    /// `crate::client`).
    pub trusted_proxies: Vec<crate::client::Cidr>,
    /// A request's header must be complete within this of its first byte, else the
    /// connection is closed.
    pub client_header_timeout: Duration,
    /// The whole request body must arrive within this, else 408.
    pub client_body_timeout: Duration,
    /// A reply write the client takes nothing of for this long ends the reply (a client that
    /// stopped reading holds no stream, upstream connection or export for good).
    pub client_send_timeout: Duration,
    /// An idle keep-alive connection is closed after this.
    pub keepalive_timeout: Duration,
    /// Share of requests in the access log (0: off).
    pub access_log_rate: f64,
    pub access_log_format: crate::access_log::Format,
    /// `[cors]`; None: no CORS.
    pub cors: Option<crate::cors::Cors>,
    /// Wrong keys one client address may present a minute before it gets 429 (on `/v1`, the
    /// usage APIs and the page alike); 0: no limit.
    pub auth_failures_per_minute: usize,
    /// `[metrics] key_label`: per-key series on `/metrics`.
    pub metrics_key_label: bool,
    /// `[telemetry]`: OTLP export of traces; None: traces are only propagated.
    pub telemetry: Option<crate::telemetry::TelemetryConfig>,
    /// `[limits] redis`: rpm, tpm, concurrency and spend shared by every gateway using it.
    pub redis: Option<Secret>,
    /// `[limits] on_redis_down`: what happens while Redis cannot be reached.
    pub on_redis_down: crate::limit::shared::OnDown,
    /// `[limits] redis_timeout_ms`: the longest a request waits for Redis.
    pub redis_timeout: Duration,
}

#[derive(Debug, Clone, Default)]
pub struct Listeners {
    pub main: Option<String>,
    pub direct: Option<String>,
    pub admin: Option<String>,
    /// `[listeners.tls.main]`: `main` speaks TLS (HTTP/2 and HTTP/1.1) with these files.
    pub main_tls: Option<crate::tls::TlsFiles>,
    /// `[listeners.tls.direct]`.
    pub direct_tls: Option<crate::tls::TlsFiles>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AuthHeader {
    #[default]
    Authorization,
    XApiKey,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub upstreams: Vec<UpstreamConfig>,
    pub api_key: Option<Secret>,
    /// The header the credential goes upstream in: `authorization` (`Bearer <key>`) or
    /// `x-api-key` (the bare key, as Anthropic's API takes it).
    pub auth_header: AuthHeader,
    pub strategy: Strategy,
    pub connect_timeout: Duration,
    /// The longest wait for any one read or write on the upstream connection.
    pub read_timeout: Duration,
    /// From the request sent to the reply's header (a plain reply is whole by then on most
    /// model servers, so this is long by default).
    pub first_byte_timeout: Duration,
    /// Between two pieces of a streamed reply.
    pub idle_timeout: Duration,
    /// How long an upstream connection waits unused in the pool before it is closed (and
    /// its buffers freed).
    pub keepalive_timeout: Duration,
    /// The whole exchange of a reply that is not streamed.
    pub request_timeout: Duration,
    /// How often each upstream is asked `GET /v1/models`; None: never.
    pub health_interval: Option<Duration>,
    /// How long an upstream stays out of rotation after a failed request.
    pub cooldown: Duration,
    pub retry_base: Duration,
    pub retry_cap: Duration,
    /// Tries of a request in all, the first included.
    pub max_attempts: u32,
    /// Upstream reply headers its clients get beyond the default set.
    pub pass_headers: headers::PassHeaders,
}

impl Strategy {
    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::RoundRobin => "round_robin",
            Strategy::Weighted => "weighted",
            Strategy::LeastConnections => "least_connections",
        }
    }
}

/// How a pool spreads requests over its upstreams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// In turn (weights ignored).
    RoundRobin,
    /// In turn, each upstream `weight` times as often (smooth: no bursts to one upstream).
    Weighted,
    /// To the upstream with the fewest requests in flight (ties in turn).
    LeastConnections,
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub url: String,
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix of the base URL, without a trailing slash ("" for none).
    pub base_path: String,
    /// Share of the pool's requests under `strategy = "weighted"` (default 1).
    pub weight: u32,
    /// This upstream's own credential (another account of the same provider); else the pool's.
    pub api_key: Option<Secret>,
    /// Where the config file names it, for the problems found when it is resolved.
    pub line: Option<usize>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    #[serde(default)]
    pub prompt: f64,
    #[serde(default)]
    pub completion: f64,
    #[serde(default)]
    pub request: f64,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub name: String,
    pub pool: String,
    pub upstream_model: String,
    pub price: Price,
    /// Models whose pools take the request, in order, when this one's cannot answer.
    pub fallbacks: Vec<String>,
    /// Who `/v1/models` says owns it (`modelgate` unless configured).
    pub owned_by: String,
}

#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    pub user: String,
    pub password_hash: Option<String>,
    pub password: Option<Secret>,
    /// The console's address as browsers see it behind a TLS-terminating proxy or CDN
    /// (`https://console.example.com`): its sign-ins and changes are same-origin, and the
    /// session cookie is `Secure` when it is https.
    pub public_origin: Option<String>,
}

pub const DEFAULT_MAX_BODY_BYTES: usize = 25 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listeners: RawListeners,
    keys: RawKeysRef,
    storage: Option<RawStorage>,
    #[serde(default)]
    pools: Vec<RawPool>,
    #[serde(default)]
    models: Vec<RawModel>,
    demo: Option<RawDemo>,
    console: Option<Spanned<RawConsole>>,
    limits: Option<RawLimits>,
    server: Option<RawServer>,
    log: Option<RawLog>,
    cors: Option<Spanned<RawCors>>,
    metrics: Option<RawMetrics>,
    telemetry: Option<Spanned<RawTelemetry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    otlp_endpoint: Spanned<String>,
    service_name: Option<String>,
    sample_rate: Option<Spanned<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    /// Per-key series (one per key id: mind the cardinality).
    key_label: Option<bool>,
}

/// The highest price (credits per 1M tokens, or per request): with the largest token count
/// believed (1e8), a cost stays a plain number (a price near f64's limit made it infinite,
/// which spent every budget for good and could not be stored).
pub const MAX_PRICE: f64 = 1e9;

/// The longest duration the config takes: a week. Every deadline made from one stays far
/// from overflowing a clock (a `grace_period_seconds` near `u64::MAX` panicked at shutdown).
const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

fn bounded<'de, D: serde::Deserializer<'de>>(
    d: D,
    unit: &str,
    max: u64,
) -> Result<Option<u64>, D::Error> {
    let v = Option::<u64>::deserialize(d)?;
    match v {
        Some(n) if n > max => Err(serde::de::Error::custom(format!(
            "{n} is more than a week: at most {max} {unit}"
        ))),
        v => Ok(v),
    }
}

/// A duration in milliseconds (`*_ms`), at most `MAX_DURATION`.
fn duration_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "ms", MAX_DURATION.as_millis() as u64)
}

/// `retention_days`: at most a hundred years (a huge number overflowed into a short retention,
/// which would have deleted the records).
fn retention_days<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let v = Option::<u64>::deserialize(d)?;
    match v {
        Some(n) if n > 36_500 => Err(serde::de::Error::custom(format!(
            "{n} days is more than a hundred years (36500)"
        ))),
        v => Ok(v),
    }
}

/// A duration in seconds (`*_seconds`), at most `MAX_DURATION`.
fn duration_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "seconds", MAX_DURATION.as_secs())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCors {
    allow_origins: Vec<String>,
    allow_methods: Option<Vec<String>>,
    allow_headers: Option<Vec<String>>,
    #[serde(default, deserialize_with = "duration_s")]
    max_age_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    /// "on", "off", or a sample rate in 0..=1.
    access: Option<Spanned<toml::Value>>,
    /// "json" (default) or "logfmt".
    format: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListeners {
    main: Option<Spanned<String>>,
    direct: Option<Spanned<String>>,
    admin: Option<Spanned<String>>,
    tls: Option<RawListenersTls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListenersTls {
    main: Option<Spanned<RawTlsFiles>>,
    direct: Option<Spanned<RawTlsFiles>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTlsFiles {
    cert: String,
    key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeysRef {
    file: Option<String>,
    source: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    sqlite: Option<String>,
    postgres: Option<Spanned<String>>,
    spool: Option<String>,
    #[serde(default, deserialize_with = "retention_days")]
    retention_days: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    name: Spanned<String>,
    upstreams: Spanned<Vec<Spanned<RawUpstream>>>,
    api_key: Option<Spanned<String>>,
    auth_header: Option<Spanned<String>>,
    strategy: Option<Spanned<String>>,
    #[serde(default, deserialize_with = "duration_ms")]
    connect_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    read_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    first_byte_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    idle_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    keepalive_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    request_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    health_interval_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    cooldown_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    retry_base_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    retry_cap_ms: Option<u64>,
    max_attempts: Option<Spanned<u32>>,
    pass_headers: Option<Spanned<Vec<String>>>,
}

/// An upstream: its base URL, or `{ url = "…", weight = 2, api_key = "env:…" }`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawUpstream {
    Url(String),
    Full(RawUpstreamTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstreamTable {
    url: String,
    weight: Option<u32>,
    api_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: Spanned<String>,
    pool: Spanned<String>,
    upstream_model: Option<String>,
    price: Option<Spanned<Price>>,
    fallbacks: Option<Spanned<Vec<String>>>,
    owned_by: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDemo {
    mock_upstream: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConsole {
    user: String,
    password_hash: Option<Spanned<String>>,
    password: Option<Spanned<String>>,
    public_origin: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_body_bytes: Option<usize>,
    auth_failures_per_minute: Option<usize>,
    redis: Option<Spanned<String>>,
    on_redis_down: Option<Spanned<String>>,
    #[serde(default, deserialize_with = "duration_ms")]
    redis_timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    threads: Option<usize>,
    trusted_proxies: Option<Spanned<Vec<String>>>,
    #[serde(default, deserialize_with = "duration_s")]
    grace_period_seconds: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    shutdown_delay_ms: Option<u64>,
    upgrade_sock: Option<String>,
    #[serde(default, deserialize_with = "duration_ms")]
    client_header_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    client_body_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    client_send_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    keepalive_timeout_ms: Option<u64>,
}

/// The keys file a `[keys]` section names, from its lines alone (each line that parses as TOML
/// on its own): `keys.toml` when it names none, None without the section or with keys in
/// Postgres.
fn keys_section_lines(text: &str) -> Option<String> {
    let mut in_keys = false;
    let mut seen = false;
    let mut file = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_keys = line == "[keys]";
            seen |= in_keys;
            continue;
        }
        if !in_keys {
            continue;
        }
        let Ok(entry) = toml::from_str::<toml::Table>(line) else {
            continue;
        };
        if entry.get("source").and_then(toml::Value::as_str) == Some("postgres") {
            return None;
        }
        if let Some(f) = entry.get("file").and_then(toml::Value::as_str) {
            file = Some(f.to_string());
        }
    }
    seen.then(|| file.unwrap_or_else(|| "keys.toml".into()))
}

impl Config {
    /// Reads, parses and validates the config file. Every problem is reported at once.
    pub fn load(path: &Path) -> Result<Config, Problems> {
        let (config, problems) = Self::load_lenient(path)?;
        problems.into_result(config)
    }

    pub fn load_lenient(path: &Path) -> Result<(Config, Problems), Problems> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Problems::one(Problem::new(&file, None, "", format!("cannot read: {e}")))
        })?;
        Self::parse_lenient(path, &text)
    }

    /// The keys file a config file names, read from its text alone (for `check`, when the
    /// config does not deserialize as a whole). None when its keys live in Postgres or the
    /// file is not TOML at all.
    pub fn keys_file_named(path: &Path) -> Option<PathBuf> {
        let text = std::fs::read_to_string(path).ok()?;
        let folder = path.parent().unwrap_or(Path::new(""));
        let Ok(table) = toml::from_str::<toml::Table>(&text) else {
            // Not TOML as a whole (a syntax error elsewhere): the `[keys]` section's lines.
            return keys_section_lines(&text).map(|file| folder.join(file));
        };
        // Only a file the config names: without `[keys]` it names none.
        let keys = table.get("keys")?.as_table()?;
        if keys.get("source").and_then(toml::Value::as_str) == Some("postgres") {
            return None;
        }
        let file = match keys.get("file") {
            None => "keys.toml",
            Some(f) => f.as_str()?,
        };
        Some(folder.join(file))
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config, Problems> {
        let (config, problems) = Self::parse_lenient(path, text)?;
        problems.into_result(config)
    }

    /// The typed config even when some values are invalid (their problems alongside), so that
    /// `check` can go on to the keys file. An unknown field or a value of the wrong type is
    /// named and left out (`problem::deserialize_all`); Err only when what remains does not
    /// deserialize either (a syntax error, a missing field).
    pub fn parse_lenient(path: &Path, text: &str) -> Result<(Config, Problems), Problems> {
        let file = path.display().to_string();
        let (raw, mut p) = problem::deserialize_all::<RawConfig>(&file, text);
        let Some(raw) = raw else { return Err(p) };
        let shape = p.0.len();
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let at = |span: std::ops::Range<usize>| Some(problem::line_of(text, span.start));

        let mut listeners = Listeners::default();
        let mut bound: Vec<(&str, std::net::SocketAddr)> = Vec::new();
        for (field, v, slot) in [
            ("listeners.main", &raw.listeners.main, &mut listeners.main),
            (
                "listeners.direct",
                &raw.listeners.direct,
                &mut listeners.direct,
            ),
            (
                "listeners.admin",
                &raw.listeners.admin,
                &mut listeners.admin,
            ),
        ] {
            if let Some(v) = v {
                match v.get_ref().parse::<std::net::SocketAddr>() {
                    Err(_) => p.push(Problem::new(
                        &file,
                        at(v.span()),
                        field,
                        "must be IP:PORT, e.g. 0.0.0.0:8080",
                    )),
                    // Two listeners on one port cannot both bind.
                    Ok(addr) => match bound.iter().find(|(_, b)| one_port(b, &addr)) {
                        Some((other, _)) if addr.port() != 0 => p.push(Problem::new(
                            &file,
                            at(v.span()),
                            field,
                            format!("{addr} is also `{other}`'s: each listener needs its own"),
                        )),
                        _ => bound.push((field, addr)),
                    },
                }
                *slot = Some(v.get_ref().clone());
            }
        }
        // Both API listeners are one service, which tells their connections apart by the
        // address each was accepted on: a port the system picks is no address to tell by.
        if let (Some(m), Some(d)) = (&raw.listeners.main, &raw.listeners.direct) {
            for (field, v) in [("listeners.main", m), ("listeners.direct", d)] {
                if v.get_ref()
                    .parse::<std::net::SocketAddr>()
                    .is_ok_and(|a| a.port() == 0)
                {
                    p.push(Problem::new(
                        &file,
                        at(v.span()),
                        field,
                        "port 0 is for one API listener alone: with both on, each needs its \
                         own port",
                    ));
                }
            }
        }
        let tls = raw.listeners.tls.as_ref();
        for (name, raw_files, on, slot) in [
            (
                "main",
                tls.and_then(|t| t.main.as_ref()),
                listeners.main.is_some(),
                &mut listeners.main_tls,
            ),
            (
                "direct",
                tls.and_then(|t| t.direct.as_ref()),
                listeners.direct.is_some(),
                &mut listeners.direct_tls,
            ),
        ] {
            let Some(raw_files) = raw_files else { continue };
            let field = format!("listeners.tls.{name}");
            let line = at(raw_files.span());
            if !on {
                p.push(Problem::new(
                    &file,
                    line,
                    &field,
                    format!("there is no `listeners.{name}` to put TLS on"),
                ));
                continue;
            }
            let files = crate::tls::TlsFiles {
                cert: dir.join(&raw_files.get_ref().cert),
                key: dir.join(&raw_files.get_ref().key),
            };
            if let Err(e) = crate::tls::load(&files) {
                p.push(Problem::new(&file, line, &field, e));
            }
            *slot = Some(files);
        }
        if listeners.main.is_none() && listeners.direct.is_none() {
            p.push(Problem::new(
                &file,
                None,
                "listeners",
                "needs at least `main` or `direct`",
            ));
        }

        let mut pools = Vec::new();
        let mut pool_names = HashSet::new();
        for (i, rp) in raw.pools.iter().enumerate() {
            let field = |f: &str| format!("pools[{i}].{f}");
            let name = rp.name.get_ref().clone();
            if name.is_empty() || !pool_names.insert(name.clone()) {
                p.push(Problem::new(
                    &file,
                    at(rp.name.span()),
                    &field("name"),
                    format!("duplicate or empty pool name '{name}'"),
                ));
            }
            if rp.upstreams.get_ref().is_empty() {
                p.push(Problem::new(
                    &file,
                    at(rp.upstreams.span()),
                    &field("upstreams"),
                    "needs at least one upstream URL",
                ));
            }
            let mut upstreams = Vec::new();
            for u in rp.upstreams.get_ref() {
                let (url, weight, key) = match u.get_ref() {
                    RawUpstream::Url(url) => (url, 1, None),
                    RawUpstream::Full(t) => (&t.url, t.weight.unwrap_or(1), t.api_key.as_ref()),
                };
                let mut problem = |m: String| {
                    p.push(Problem::new(&file, at(u.span()), &field("upstreams"), m));
                };
                if !(1..=1000).contains(&weight) {
                    problem(format!("weight of '{url}' must be 1 to 1000"));
                }
                let api_key = match key.map(|k| resolve_secret(k)) {
                    None => None,
                    Some(Ok(s)) => Some(s),
                    Some(Err(m)) => {
                        problem(m);
                        None
                    }
                };
                match parse_upstream_url(url) {
                    Ok(mut up) => {
                        up.weight = weight;
                        up.api_key = api_key;
                        up.line = at(u.span());
                        upstreams.push(up);
                    }
                    Err(m) => problem(m),
                }
            }
            let strategy = match rp.strategy.as_ref().map(|s| s.get_ref().as_str()) {
                None | Some("round_robin") => Strategy::RoundRobin,
                Some("weighted") => Strategy::Weighted,
                Some("least_connections") => Strategy::LeastConnections,
                Some(other) => {
                    p.push(Problem::new(
                        &file,
                        rp.strategy.as_ref().and_then(|s| at(s.span())),
                        &field("strategy"),
                        format!("'{other}' is not one of round_robin, weighted, least_connections"),
                    ));
                    Strategy::RoundRobin
                }
            };
            let auth_header = match rp.auth_header.as_ref().map(|s| s.get_ref().as_str()) {
                None | Some("authorization") => AuthHeader::Authorization,
                Some("x-api-key") => AuthHeader::XApiKey,
                Some(other) => {
                    p.push(Problem::new(
                        &file,
                        rp.auth_header.as_ref().and_then(|s| at(s.span())),
                        &field("auth_header"),
                        format!("'{other}' is not one of authorization, x-api-key"),
                    ));
                    AuthHeader::Authorization
                }
            };
            let max_attempts = rp.max_attempts.as_ref().map_or(3, |m| *m.get_ref());
            if !(1..=10).contains(&max_attempts) {
                p.push(Problem::new(
                    &file,
                    rp.max_attempts.as_ref().and_then(|m| at(m.span())),
                    &field("max_attempts"),
                    "must be 1 to 10",
                ));
            }
            let ms = |v: Option<u64>, default: u64| Duration::from_millis(v.unwrap_or(default));
            let read_timeout = ms(rp.read_timeout_ms, 300_000);
            let api_key = match &rp.api_key {
                None => None,
                Some(k) => match resolve_secret(k.get_ref()) {
                    Ok(s) => Some(s),
                    Err(m) => {
                        p.push(Problem::new(&file, at(k.span()), &field("api_key"), m));
                        None
                    }
                },
            };
            let pass_headers = match &rp.pass_headers {
                None => headers::PassHeaders::default(),
                Some(names) => headers::PassHeaders::parse(names.get_ref()).unwrap_or_else(|m| {
                    p.push(Problem::new(
                        &file,
                        at(names.span()),
                        &field("pass_headers"),
                        m,
                    ));
                    headers::PassHeaders::default()
                }),
            };
            pools.push(PoolConfig {
                name,
                upstreams,
                api_key,
                auth_header,
                strategy,
                connect_timeout: ms(rp.connect_timeout_ms, 5_000),
                read_timeout,
                first_byte_timeout: rp
                    .first_byte_timeout_ms
                    .map_or(read_timeout, Duration::from_millis),
                idle_timeout: rp
                    .idle_timeout_ms
                    .map_or(read_timeout, Duration::from_millis),
                keepalive_timeout: ms(rp.keepalive_timeout_ms, 60_000),
                request_timeout: ms(rp.request_timeout_ms, 600_000),
                health_interval: match rp.health_interval_ms {
                    Some(0) => None,
                    v => Some(ms(v, 10_000)),
                },
                cooldown: ms(rp.cooldown_ms, 10_000),
                retry_base: ms(rp.retry_base_ms, 200),
                retry_cap: ms(rp.retry_cap_ms, 5_000),
                max_attempts: max_attempts.clamp(1, 10),
                pass_headers,
            });
        }

        let mut models = Vec::new();
        let mut model_names = HashSet::new();
        for (i, rm) in raw.models.iter().enumerate() {
            let name = rm.name.get_ref().clone();
            if name.is_empty() || !model_names.insert(name.clone()) {
                p.push(Problem::new(
                    &file,
                    at(rm.name.span()),
                    &format!("models[{i}].name"),
                    format!("duplicate or empty model name '{name}'"),
                ));
            }
            if name.len() > crate::route::body::MAX_MODEL_LEN {
                p.push(Problem::new(
                    &file,
                    at(rm.name.span()),
                    &format!("models[{i}].name"),
                    format!(
                        "longer than {} bytes, the longest model name a request may \
                         give",
                        crate::route::body::MAX_MODEL_LEN
                    ),
                ));
            }
            if !pool_names.contains(rm.pool.get_ref()) {
                p.push(Problem::new(
                    &file,
                    at(rm.pool.span()),
                    &format!("models[{i}].pool"),
                    format!("no pool named '{}'", rm.pool.get_ref()),
                ));
            }
            let price = rm.price.as_ref().map(|s| *s.get_ref()).unwrap_or_default();
            if let Some(s) = &rm.price {
                if [price.prompt, price.completion, price.request]
                    .iter()
                    .any(|v| !v.is_finite() || *v < 0.0 || *v > MAX_PRICE)
                {
                    p.push(Problem::new(
                        &file,
                        at(s.span()),
                        &format!("models[{i}].price"),
                        format!("prices must be from 0 to {MAX_PRICE}"),
                    ));
                }
            }
            let owned_by = match &rm.owned_by {
                None => "modelgate".to_string(),
                Some(o) => {
                    let v = o.get_ref();
                    if v.is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
                        p.push(Problem::new(
                            &file,
                            at(o.span()),
                            &format!("models[{i}].owned_by"),
                            "must be 1 to 256 characters, none of them a control character",
                        ));
                    }
                    v.clone()
                }
            };
            models.push(ModelConfig {
                owned_by,
                upstream_model: rm.upstream_model.clone().unwrap_or_else(|| name.clone()),
                name,
                pool: rm.pool.get_ref().clone(),
                price,
                fallbacks: rm
                    .fallbacks
                    .as_ref()
                    .map(|f| f.get_ref().clone())
                    .unwrap_or_default(),
            });
        }

        for (i, (rm, m)) in raw.models.iter().zip(&models).enumerate() {
            for f in &m.fallbacks {
                if f == &m.name || !model_names.contains(f) {
                    p.push(Problem::new(
                        &file,
                        rm.fallbacks.as_ref().and_then(|f| at(f.span())),
                        &format!("models[{i}].fallbacks"),
                        format!("'{f}' is not another configured model"),
                    ));
                }
            }
        }

        let demo_mock_upstream = raw.demo.and_then(|d| d.mock_upstream).map(|m| {
            let problem = match m.get_ref().parse::<std::net::SocketAddr>() {
                Err(_) => Some("must be IP:PORT".to_string()),
                // It listens too: not on a listener's port.
                Ok(addr) => bound
                    .iter()
                    .find(|(_, b)| addr.port() != 0 && one_port(b, &addr))
                    .map(|(other, _)| format!("{addr} is also `{other}`'s: it needs its own")),
            };
            if let Some(message) = problem {
                p.push(Problem::new(
                    &file,
                    at(m.span()),
                    "demo.mock_upstream",
                    message,
                ));
            }
            m.into_inner()
        });

        let console = raw.console.map(|c| {
            let table_line = at(c.span());
            let c = c.into_inner();
            let password = c
                .password
                .and_then(|pw| match resolve_secret(pw.get_ref()) {
                    Ok(s) => Some(s),
                    Err(m) => {
                        p.push(Problem::new(&file, at(pw.span()), "console.password", m));
                        None
                    }
                });
            if let Some(h) = &c.password_hash {
                // A whole PHC string: argon2id, its parameters, a salt and a hash.
                let argon2id = argon2::PasswordHash::new(h.get_ref()).is_ok_and(|ph| {
                    ph.algorithm == argon2::Algorithm::Argon2id.ident()
                        && ph.salt.is_some()
                        && ph.hash.is_some()
                        && argon2::Params::try_from(&ph).is_ok()
                });
                if !argon2id {
                    p.push(Problem::new(
                        &file,
                        at(h.span()),
                        "console.password_hash",
                        "is not an argon2id hash: make one with `modelgate password-hash`",
                    ));
                }
            }
            if c.password_hash.is_none() && password.is_none() {
                p.push(Problem::new(
                    &file,
                    table_line,
                    "console",
                    "needs `password_hash` or `password`",
                ));
            }
            let public_origin = c.public_origin.and_then(|o| {
                let v = o.get_ref().trim_end_matches('/').to_string();
                let ok = v.parse::<http::Uri>().is_ok_and(|u| {
                    matches!(u.scheme_str(), Some("http" | "https"))
                        && u.authority().is_some()
                        && u.path_and_query()
                            .is_none_or(|p| p.as_str().is_empty() || p == "/")
                });
                if !ok {
                    p.push(Problem::new(
                        &file,
                        at(o.span()),
                        "console.public_origin",
                        "is not an origin: a scheme and a host, as https://console.example.com",
                    ));
                }
                // A browser's Origin leaves out the scheme's default port.
                let v = v
                    .strip_suffix(":443")
                    .filter(|o| o.starts_with("https://"))
                    .or_else(|| v.strip_suffix(":80").filter(|o| o.starts_with("http://")))
                    .map_or_else(|| v.clone(), str::to_string);
                ok.then_some(v)
            });
            ConsoleConfig {
                user: c.user,
                password_hash: c.password_hash.map(Spanned::into_inner),
                password,
                public_origin,
            }
        });

        let server = raw.server;
        let trusted_proxies: Vec<crate::client::Cidr> = server
            .as_ref()
            .and_then(|s| s.trusted_proxies.as_ref())
            .map(|list| {
                list.get_ref()
                    .iter()
                    .filter_map(|v| match crate::client::Cidr::parse(v) {
                        Ok(c) => Some(c),
                        Err(m) => {
                            p.push(Problem::new(
                                &file,
                                at(list.span()),
                                "server.trusted_proxies",
                                m,
                            ));
                            None
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let cors = raw.cors.as_ref().and_then(|c| {
            let r = c.get_ref();
            crate::cors::Cors::new(
                &r.allow_origins,
                r.allow_methods.as_deref(),
                r.allow_headers.as_deref(),
                r.max_age_seconds.unwrap_or(600),
            )
            .map_err(|m| p.push(Problem::new(&file, at(c.span()), "cors", m)))
            .ok()
        });
        let telemetry = raw.telemetry.as_ref().and_then(|t| {
            let r = t.get_ref();
            let endpoint = r.otlp_endpoint.get_ref();
            let endpoint_ok = (endpoint.starts_with("http://") || endpoint.starts_with("https://"))
                && endpoint.parse::<http::Uri>().is_ok();
            if !endpoint_ok {
                p.push(Problem::new(
                    &file,
                    at(r.otlp_endpoint.span()),
                    "telemetry.otlp_endpoint",
                    "must be an http:// or https:// URL",
                ));
            }
            let sample_rate = r.sample_rate.as_ref().map_or(1.0, |s| *s.get_ref());
            if !(0.0..=1.0).contains(&sample_rate) {
                p.push(Problem::new(
                    &file,
                    r.sample_rate.as_ref().and_then(|s| at(s.span())),
                    "telemetry.sample_rate",
                    "must be between 0 and 1",
                ));
                return None;
            }
            endpoint_ok.then(|| crate::telemetry::TelemetryConfig {
                otlp_endpoint: endpoint.clone(),
                service_name: r.service_name.clone().unwrap_or_else(|| "modelgate".into()),
                sample_rate,
            })
        });
        let (access_log_rate, access_log_format) =
            log_settings(raw.log.as_ref(), &file, &mut p, &at);
        let postgres = raw.storage.as_ref().and_then(|s| {
            let pg = s.postgres.as_ref()?;
            let bad = |m: String| Problem::new(&file, at(pg.span()), "storage.postgres", m);
            if s.sqlite.is_some() {
                p.push(bad("set sqlite or postgres, not both".into()));
                return None;
            }
            let secret = resolve_secret(pg.get_ref())
                .map_err(|m| p.push(bad(m)))
                .ok()?;
            crate::store::check_postgres_url(secret.expose())
                .map_err(|m| p.push(bad(m)))
                .ok()?;
            Some(secret)
        });
        let redis = raw.limits.as_ref().and_then(|l| {
            let url = l.redis.as_ref()?;
            let bad = |m: String| Problem::new(&file, at(url.span()), "limits.redis", m);
            let secret = resolve_secret(url.get_ref())
                .map_err(|m| p.push(bad(m)))
                .ok()?;
            let ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
                .iter()
                .any(|s| secret.expose().starts_with(s));
            if !ok {
                p.push(bad("must be a redis://, rediss:// or unix:// URL".into()));
                return None;
            }
            Some(secret)
        });
        let on_redis_down = match raw.limits.as_ref().and_then(|l| l.on_redis_down.as_ref()) {
            None => crate::limit::shared::OnDown::Local,
            Some(v) => match v.get_ref().as_str() {
                "local" => crate::limit::shared::OnDown::Local,
                "deny" => crate::limit::shared::OnDown::Deny,
                _ => {
                    p.push(Problem::new(
                        &file,
                        at(v.span()),
                        "limits.on_redis_down",
                        "must be \"local\" or \"deny\"",
                    ));
                    crate::limit::shared::OnDown::Local
                }
            },
        };
        let keys_in_postgres = match &raw.keys.source {
            None => false,
            Some(v) => {
                let bad = |m: &str| Problem::new(&file, at(v.span()), "keys.source", m);
                match v.get_ref().as_str() {
                    "file" => false,
                    "postgres" if postgres.is_some() => true,
                    "postgres" => {
                        p.push(bad("\"postgres\" needs [storage] postgres"));
                        false
                    }
                    _ => {
                        p.push(bad("must be \"file\" or \"postgres\""));
                        false
                    }
                }
            }
        };
        let threads_default = default_threads();
        let config = Config {
            path: path.to_path_buf(),
            listeners,
            keys_file: dir.join(raw.keys.file.as_deref().unwrap_or("keys.toml")),
            keys_in_postgres,
            sqlite: dir.join(
                raw.storage
                    .as_ref()
                    .and_then(|s| s.sqlite.clone())
                    .unwrap_or_else(|| "usage.db".into()),
            ),
            postgres,
            spool: dir.join(
                raw.storage
                    .as_ref()
                    .and_then(|s| s.spool.clone())
                    .unwrap_or_else(|| "usage-spool.jsonl".into()),
            ),
            retention: raw
                .storage
                .as_ref()
                .and_then(|s| s.retention_days)
                .filter(|d| *d > 0)
                .map(|d| Duration::from_secs(d * 86_400)),
            pools,
            models,
            demo_mock_upstream,
            max_body_bytes: raw
                .limits
                .as_ref()
                .and_then(|l| l.max_body_bytes)
                .unwrap_or(DEFAULT_MAX_BODY_BYTES),
            auth_failures_per_minute: raw
                .limits
                .as_ref()
                .and_then(|l| l.auth_failures_per_minute)
                .unwrap_or(crate::web::throttle::FAILURES_PER_WINDOW),
            telemetry,
            redis,
            on_redis_down,
            redis_timeout: Duration::from_millis(
                raw.limits
                    .as_ref()
                    .and_then(|l| l.redis_timeout_ms)
                    .unwrap_or(250)
                    .max(1),
            ),
            metrics_key_label: raw
                .metrics
                .as_ref()
                .and_then(|m| m.key_label)
                .unwrap_or(false),
            console,
            threads: server
                .as_ref()
                .and_then(|s| s.threads)
                .unwrap_or(threads_default)
                .max(1),
            grace_period_seconds: server
                .as_ref()
                .and_then(|s| s.grace_period_seconds)
                .unwrap_or(5),
            shutdown_delay: Duration::from_millis(
                server
                    .as_ref()
                    .and_then(|s| s.shutdown_delay_ms)
                    .unwrap_or(0),
            ),
            client_header_timeout: Duration::from_millis(
                server
                    .as_ref()
                    .and_then(|s| s.client_header_timeout_ms)
                    .unwrap_or(10_000),
            ),
            client_body_timeout: Duration::from_millis(
                server
                    .as_ref()
                    .and_then(|s| s.client_body_timeout_ms)
                    .unwrap_or(60_000),
            ),
            client_send_timeout: Duration::from_millis(
                server
                    .as_ref()
                    .and_then(|s| s.client_send_timeout_ms)
                    .unwrap_or(60_000)
                    .max(1),
            ),
            keepalive_timeout: Duration::from_millis(
                server
                    .as_ref()
                    .and_then(|s| s.keepalive_timeout_ms)
                    .unwrap_or(60_000),
            ),
            access_log_rate,
            access_log_format,
            cors,
            trusted_proxies,
            upgrade_sock: dir.join(
                server
                    .and_then(|s| s.upgrade_sock)
                    .unwrap_or_else(|| "modelgate-upgrade.sock".into()),
            ),
        };
        Ok((config, p.after_shape(shape)))
    }
}

/// `[log]`: the access log's sample rate and format.
fn log_settings(
    log: Option<&RawLog>,
    file: &str,
    p: &mut Problems,
    at: &dyn Fn(std::ops::Range<usize>) -> Option<usize>,
) -> (f64, crate::access_log::Format) {
    use crate::access_log::Format;
    let rate = match log.and_then(|l| l.access.as_ref()) {
        None => 1.0,
        Some(v) => match v.get_ref() {
            toml::Value::String(s) if s == "on" => 1.0,
            toml::Value::String(s) if s == "off" => 0.0,
            toml::Value::Float(f) if (0.0..=1.0).contains(f) => *f,
            toml::Value::Integer(i @ (0 | 1)) => *i as f64,
            _ => {
                p.push(Problem::new(
                    file,
                    at(v.span()),
                    "log.access",
                    "must be \"on\", \"off\" or a sample rate from 0 to 1",
                ));
                1.0
            }
        },
    };
    let format = match log.and_then(|l| l.format.as_ref()) {
        None => Format::Json,
        Some(f) => match f.get_ref().as_str() {
            "json" => Format::Json,
            "logfmt" => Format::Logfmt,
            other => {
                p.push(Problem::new(
                    file,
                    at(f.span()),
                    "log.format",
                    format!("'{other}' is not json or logfmt"),
                ));
                Format::Json
            }
        },
    };
    (rate, format)
}

/// `literal` or `env:NAME`.
fn resolve_secret(v: &str) -> Result<Secret, String> {
    match v.strip_prefix("env:") {
        Some(name) => std::env::var(name)
            .map(Secret)
            .map_err(|_| format!("environment variable {name} is not set")),
        None => Ok(Secret(v.to_string())),
    }
}

/// Whether two listen addresses cannot both be bound: the same port, and the same address or
/// an unspecified one covering the other (`0.0.0.0` every IPv4 address; `[::]`, dual-stack as
/// Pingora binds it, every address).
fn one_port(a: &std::net::SocketAddr, b: &std::net::SocketAddr) -> bool {
    let covers = |x: std::net::IpAddr, y: std::net::IpAddr| {
        x.is_unspecified() && (x.is_ipv6() || y.is_ipv4())
    };
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() == b.port() && (x == y || covers(x, y) || covers(y, x))
}

/// An upstream URL with a `@` as its message shows it: whatever precedes its last `@` after
/// the scheme (a user and password, which may hold `/` or `?`) left out.
fn shown_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    match rest.rfind('@') {
        Some(at) if scheme.is_empty() => format!("…@{}", &rest[at + 1..]),
        Some(at) => format!("{scheme}://…@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

fn parse_upstream_url(url: &str) -> Result<UpstreamConfig, String> {
    // Said first, whatever else is wrong, so no message repeats a user and password.
    if url.contains('@') {
        return Err(format!(
            "'{}': an upstream URL carries no user or password: give the credential as \
             `api_key`",
            shown_url(url)
        ));
    }
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("'{url}' must start with http:// or https://"));
    };
    if rest.contains(['?', '#']) {
        return Err(format!(
            "'{url}': a base URL has no query or fragment (request paths are added to it)"
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if url.parse::<http::Uri>().is_err() || url.chars().any(|c| c.is_whitespace()) {
        return Err(format!(
            "'{}' is not a valid URL (a space or another character a URL cannot hold)",
            url.escape_debug()
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            let port = p
                .parse::<u16>()
                .map_err(|_| format!("'{url}' has a bad port"))?;
            (h, port)
        }
        _ => (authority, if tls { 443 } else { 80 }),
    };
    if host.is_empty() {
        return Err(format!("'{url}' has no host"));
    }
    let base_path = path.trim_end_matches('/');
    if base_path.ends_with("/v1") {
        return Err(format!("'{url}': give the base URL without /v1"));
    }
    Ok(UpstreamConfig {
        url: url.to_string(),
        tls,
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        base_path: base_path.to_string(),
        weight: 1,
        api_key: None,
        line: None,
    })
}

/// Both API listeners are one Pingora service with one runtime of `threads` threads: by
/// default one a core, whichever listener gets the traffic.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[listeners]
main = "127.0.0.1:8080"
direct = "127.0.0.1:8081"
[keys]
file = "keys.toml"
[[pools]]
name = "local"
upstreams = ["http://127.0.0.1:9100", "https://api.example.com/openai/"]
[[models]]
name = "echo-1"
pool = "local"
price = { prompt = 1.0, completion = 2.0 }
"#;

    #[test]
    fn a_good_config_loads_and_paths_resolve_against_its_folder() {
        let c = Config::parse(Path::new("/etc/mg/modelgate.toml"), GOOD).expect("valid");
        assert_eq!(c.keys_file, Path::new("/etc/mg/keys.toml"));
        let up = &c.pools[0].upstreams[1];
        assert!(up.tls);
        assert_eq!(
            (up.host.as_str(), up.port, up.base_path.as_str()),
            ("api.example.com", 443, "/openai")
        );
        assert_eq!(c.models[0].upstream_model, "echo-1");
        assert_eq!(c.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    /// An upstream URL that could not be asked (a space in it) is refused by `check`, and one
    /// with a user and password is refused without repeating them.
    #[test]
    fn an_upstream_url_with_a_space_or_a_password_is_refused() {
        for (url, says) in [
            ("http://127.0.0.1:9100/ x", "not a valid URL"),
            ("http://127.0.0.1:9100/a\tb", "not a valid URL"),
            ("http://user:hunter2@api.example.com", "no user or password"),
            ("htps://user:hunter2@api.example.com", "no user or password"),
            (
                "http://user:hunter2@api.example.com/?x",
                "no user or password",
            ),
            (
                "http://user:hun/ter2@api.example.com",
                "no user or password",
            ),
        ] {
            let text = GOOD.replace("http://127.0.0.1:9100", url);
            let e = Config::parse(Path::new("c.toml"), &text).expect_err(url);
            let s = e.to_string();
            assert!(s.contains(says) && s.contains("c.toml:"), "{s}");
            assert!(!s.contains("hunter2") && !s.contains("ter2"), "{s}");
        }
    }

    #[test]
    fn pass_headers_and_owned_by_are_checked_where_they_are_written() {
        let text = GOOD
            .replace(
                "name = \"local\"\n",
                "name = \"local\"\npass_headers = [\"openai-processing-ms\", \"set-cookie\"]\n",
            )
            .replace("pool = \"local\"\n", "pool = \"local\"\nowned_by = \"\"\n");
        let s = Config::parse(Path::new("c.toml"), &text)
            .expect_err("refused")
            .to_string();
        assert!(
            s.contains("c.toml:9: pools[0].pass_headers: 'set-cookie'"),
            "{s}"
        );
        assert!(s.contains("models[0].owned_by"), "{s}");
        let text = GOOD.replace(
            "name = \"local\"\n",
            "name = \"local\"\npass_headers = [\"OpenAI-Processing-Ms\", \"x-mock-*\"]\n",
        );
        let c = Config::parse(Path::new("c.toml"), &text).expect("valid");
        let pass = &c.pools[0].pass_headers;
        assert!(pass.allows("openai-processing-ms") && pass.allows("x-mock-model"));
        assert_eq!(c.models[0].owned_by, "modelgate");
    }

    #[test]
    fn port_0_is_refused_for_an_api_listener_beside_the_other() {
        let text = GOOD.replace("127.0.0.1:8081", "127.0.0.1:0");
        let s = Config::parse(Path::new("c.toml"), &text)
            .expect_err("refused")
            .to_string();
        assert!(s.contains("c.toml:4: listeners.direct: port 0"), "{s}");
        let alone = GOOD
            .replace("direct = \"127.0.0.1:8081\"\n", "")
            .replace("127.0.0.1:8080", "127.0.0.1:0");
        Config::parse(Path::new("c.toml"), &alone).expect("one listener may take port 0");
    }

    #[test]
    fn unknown_fields_are_reported_with_line() {
        let text = GOOD.replace("[keys]", "[keys]\nfiel = 1");
        let e = Config::parse(Path::new("c.toml"), &text).expect_err("unknown field");
        let s = e.to_string();
        assert!(s.contains("c.toml:6"), "{s}");
        assert!(s.contains("fiel"), "{s}");
    }

    #[test]
    fn listeners_on_one_port_are_told_apart_as_linux_binds_them() {
        let a = |s: &str| s.parse::<std::net::SocketAddr>().expect("addr");
        for (x, y, clash) in [
            ("127.0.0.1:80", "127.0.0.1:80", true),
            ("127.0.0.1:80", "127.0.0.1:81", false),
            ("0.0.0.0:80", "10.0.0.1:80", true),
            ("127.0.0.1:80", "10.0.0.1:80", false),
            // `0.0.0.0` is IPv4 only; `[::]` is dual-stack.
            ("0.0.0.0:80", "[::1]:80", false),
            ("[::]:80", "127.0.0.1:80", true),
            ("[::ffff:127.0.0.1]:80", "127.0.0.1:80", true),
        ] {
            assert_eq!(one_port(&a(x), &a(y)), clash, "{x} {y}");
            assert_eq!(one_port(&a(y), &a(x)), clash, "{y} {x}");
        }
    }

    #[test]
    fn every_semantic_problem_is_reported() {
        let text = GOOD
            .replace("pool = \"local\"", "pool = \"nope\"")
            .replace("http://127.0.0.1:9100", "ftp://x");
        let e = Config::parse(Path::new("c.toml"), &text).expect_err("bad");
        assert_eq!(e.0.len(), 2, "{e}");
        let s = e.to_string();
        assert!(
            s.contains("models[0].pool") && s.contains("pools[0].upstreams"),
            "{s}"
        );
        // A query or fragment in a base URL would end up in the middle of each request's URL.
        for url in ["http://upstream?x=1", "https://upstream/base#f"] {
            let text = GOOD.replace("http://127.0.0.1:9100", url);
            let e = Config::parse(Path::new("c.toml"), &text).expect_err("bad");
            assert!(e.to_string().contains("no query or fragment"), "{e}");
        }
    }

    #[test]
    fn new_sections_are_validated() {
        let with = |extra: &str| Config::parse(Path::new("c.toml"), &format!("{GOOD}\n{extra}"));
        let c = with("[telemetry]\notlp_endpoint = \"http://otel:4318\"\n[metrics]\nkey_label = true\n[limits]\nauth_failures_per_minute = 0\n").expect("valid");
        let t = c.telemetry.expect("telemetry");
        assert_eq!((t.service_name.as_str(), t.sample_rate), ("modelgate", 1.0));
        assert!(c.metrics_key_label);
        assert_eq!(c.auth_failures_per_minute, 0);
        for (extra, field) in [
            ("[telemetry]\notlp_endpoint = \"otel:4318\"\n", "telemetry"),
            (
                "[telemetry]\notlp_endpoint = \"http://o\"\nsample_rate = 2.0\n",
                "telemetry",
            ),
        ] {
            let e = with(extra).expect_err(extra).to_string();
            assert!(e.contains(field), "{e}");
        }
        let bad_header = GOOD.replace(
            "name = \"local\"",
            "name = \"local\"\nauth_header = \"bearer\"",
        );
        let e = Config::parse(Path::new("c.toml"), &bad_header).expect_err("auth_header");
        assert!(e.to_string().contains("auth_header"), "{e}");
    }

    #[test]
    fn fleet_settings_are_read_and_their_mistakes_named() {
        let with = |extra: &str| Config::parse(Path::new("c.toml"), &format!("{GOOD}\n{extra}"));
        let c = with(
            "[storage]\npostgres = \"postgres://mg@db:5432/mg\"\n[limits]\nredis = \"redis://cache:6379\"\n\
             on_redis_down = \"deny\"\nredis_timeout_ms = 50\n",
        )
        .expect("valid");
        assert_eq!(
            c.postgres.as_ref().map(Secret::expose),
            Some("postgres://mg@db:5432/mg")
        );
        assert_eq!(
            c.redis.as_ref().map(Secret::expose),
            Some("redis://cache:6379")
        );
        assert_eq!(c.on_redis_down, crate::limit::shared::OnDown::Deny);
        assert_eq!(c.redis_timeout, Duration::from_millis(50));
        assert!(!c.keys_in_postgres);
        assert!(c.spool.ends_with("usage-spool.jsonl"));
        // The secrets never show in Debug.
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("mg@db") && !dbg.contains("cache:6379"),
            "{dbg}"
        );
        let keys_pg = GOOD.replace("[keys]", "[keys]\nsource = \"postgres\"");
        let c = Config::parse(
            Path::new("c.toml"),
            &format!("{keys_pg}\n[storage]\npostgres = \"host=/tmp user=mg\"\n"),
        )
        .expect("key=value settings");
        assert!(c.keys_in_postgres);
        for (extra, field, says) in [
            (
                "[storage]\nsqlite = \"u.db\"\npostgres = \"postgres://db/mg\"\n",
                "storage.postgres",
                "not both",
            ),
            (
                "[storage]\npostgres = \"postgres://db:notaport/mg\"\n",
                "storage.postgres",
                "connection string",
            ),
            (
                "[storage]\npostgres = \"env:MG_TEST_UNSET_PG_VAR\"\n",
                "storage.postgres",
                "is not set",
            ),
            (
                "[limits]\nredis = \"http://cache\"\n",
                "limits.redis",
                "redis://",
            ),
            (
                "[limits]\non_redis_down = \"maybe\"\n",
                "limits.on_redis_down",
                "\"local\" or \"deny\"",
            ),
        ] {
            let e = with(extra).expect_err(extra).to_string();
            assert!(e.contains(field) && e.contains(says), "{extra}: {e}");
        }
        let e = Config::parse(Path::new("c.toml"), &keys_pg).expect_err("no postgres");
        assert!(e.to_string().contains("needs [storage] postgres"), "{e}");
        let bad = GOOD.replace("[keys]", "[keys]\nsource = \"etcd\"");
        let e = Config::parse(Path::new("c.toml"), &bad).expect_err("unknown source");
        assert!(e.to_string().contains("keys.source"), "{e}");
    }
}
