//! The configuration as the gateway uses it: validated and typed, built by `Config::parse`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// A credential sent upstream. Debug never shows it and it is never serialized.
#[derive(Clone)]
pub struct Secret(pub(super) String);

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
    /// The folder of the journal each request's record goes to before the store has it, so a
    /// crash loses none (default `usage-journal` beside the config); None: `"off"`.
    pub journal: Option<PathBuf>,
    /// Usage records older than this are deleted; None keeps them forever.
    pub retention: Option<Duration>,
    /// `[storage] on_store_full`: what happens once records that cannot be stored fill
    /// their bounds.
    pub on_store_full: OnStoreFull,
    /// `[storage] memory_max_records`: records that may wait in memory (default 200,000).
    pub memory_max_records: usize,
    /// `[storage] spool_max_bytes`: bytes that may wait in the spool (default 1 GiB).
    pub spool_max_bytes: u64,
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
    /// `crate::auth::client`).
    pub trusted_proxies: Vec<super::Cidr>,
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
    /// `[server] on_client_gone = "finish"` (default): the upstream's reply to a client that
    /// left is read to its end (not sent) so its usage is billed; false: `"cancel"`.
    pub finish_when_gone: bool,
    /// Share of requests in the access log (0: off).
    pub access_log_rate: f64,
    pub access_log_format: crate::ops::access_log::Format,
    /// `[log] access_file`: the access log appended to this file; None: stdout.
    pub access_log_file: Option<PathBuf>,
    /// `[cors]`; None: no CORS.
    pub cors: Option<super::Cors>,
    /// Wrong keys one client address may present a minute before it gets 429 (on `/v1`, the
    /// usage APIs and the page alike); 0: no limit.
    pub auth_failures_per_minute: usize,
    /// `[metrics] key_label`: per-key series on `/metrics`.
    pub metrics_key_label: bool,
    /// `[telemetry]`: OTLP export of traces; None: traces are only propagated.
    pub telemetry: Option<crate::ops::telemetry::TelemetryConfig>,
    /// `[limits] redis`: rpm, tpm, concurrency and spend shared by every gateway using it.
    pub redis: Option<Secret>,
    /// `[limits] on_redis_down`: what happens while Redis cannot be reached.
    pub on_redis_down: super::OnDown,
    /// `[limits] redis_timeout_ms`: the longest a request waits for Redis.
    pub redis_timeout: Duration,
    /// `[limits] budget_mode`: when a budget is checked against a request's cost.
    pub budget_mode: BudgetMode,
}

/// What the gateway does once records that neither the database nor the spool takes fill
/// their bound in memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnStoreFull {
    /// New requests are refused with 503 `usage_store_unavailable`; no record is dropped.
    #[default]
    Refuse,
    /// Requests are served; their records past the bound are dropped and counted.
    Serve,
}

/// When a key's budget is checked against a request's cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BudgetMode {
    /// The request's worst cost is held at admission (its output limit lowered to what the
    /// budget can pay) and settled to the real cost at its end: a budget is a cap.
    #[default]
    Reserve,
    /// 402 once the spend has reached the budget; requests in flight may go past it.
    After,
}

#[derive(Debug, Clone, Default)]
pub struct Listeners {
    pub main: Option<String>,
    pub direct: Option<String>,
    pub admin: Option<String>,
    /// `[listeners.tls.main]`: `main` speaks TLS (HTTP/2 and HTTP/1.1) with these files.
    pub main_tls: Option<super::TlsFiles>,
    /// `[listeners.tls.direct]`.
    pub direct_tls: Option<super::TlsFiles>,
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
    pub pass_headers: super::headers::PassHeaders,
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
    /// The output a budget or tpm reservation assumes when a request names no limit.
    pub max_output_tokens: u64,
}

/// The output a reservation assumes for a model that sets no `max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 4096;

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
