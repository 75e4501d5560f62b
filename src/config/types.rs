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

/// The config file, checked and typed: its sections as the file has them, split by what a
/// reload puts in force (`live`) and what takes a restart (`fixed`).
#[derive(Debug, Clone)]
pub struct Config {
    pub fixed: Fixed,
    pub live: LiveConfig,
}

/// The sections a reload does not change: read once at start.
#[derive(Debug, Clone)]
pub struct Fixed {
    /// The config file itself.
    pub path: PathBuf,
    pub listeners: Listeners,
    pub keys: super::KeysConfig,
    pub storage: super::Storage,
    pub server: super::Server,
    pub limits: super::Limits,
    pub log: super::Log,
    /// `[cors]`; None: no CORS.
    pub cors: Option<super::Cors>,
    pub metrics: super::MetricsConfig,
    /// `[telemetry]`: OTLP export of traces; None: traces are only propagated.
    pub telemetry: Option<crate::ops::telemetry::TelemetryConfig>,
    /// `[demo] mock_upstream`: the in-process mock model server's address.
    pub demo_mock_upstream: Option<String>,
}

/// The sections a reload puts in force (with the keys, in one swap: `route::live`).
#[derive(Debug, Clone, Default)]
pub struct LiveConfig {
    pub pools: Vec<PoolConfig>,
    pub models: Vec<ModelConfig>,
    /// `[routing] default_model`: the model for ids no model entry matches.
    pub default_model: Option<String>,
    /// `[console]`; None: no console.
    pub console: Option<ConsoleConfig>,
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

/// The API a pool's upstreams speak (`provider`): what the gateway translates requests to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Provider {
    /// OpenAI's APIs: the inbound APIs named in `native` pass through; the Responses and
    /// Messages APIs, when not named, arrive as Chat Completions.
    #[default]
    OpenAi,
    /// Anthropic's Messages API: every inbound API arrives as a message.
    Anthropic,
}

impl Provider {
    pub const ALL: [Provider; 2] = [Provider::OpenAi, Provider::Anthropic];

    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }

    /// The APIs a pool of this kind passes through unless its `native` says otherwise.
    pub fn default_native(self) -> Native {
        match self {
            Provider::OpenAi => Native(Api::ALL.iter().fold(0, |bits, api| bits | api.bit())),
            Provider::Anthropic => Native(Api::Messages.bit()),
        }
    }
}

/// An inbound API a pool may take as it is (`native`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
    Embeddings,
    Images,
    Audio,
    Moderations,
    Responses,
    Messages,
}

impl Api {
    pub const ALL: [Api; 8] = [
        Api::Chat,
        Api::Completions,
        Api::Embeddings,
        Api::Images,
        Api::Audio,
        Api::Moderations,
        Api::Responses,
        Api::Messages,
    ];

    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Embeddings => "embeddings",
            Api::Images => "images",
            Api::Audio => "audio",
            Api::Moderations => "moderations",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }

    pub fn parse(s: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|a| a.name() == s)
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The inbound APIs a pool passes through untranslated (`native`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Native(u16);

impl Native {
    pub fn of(apis: impl IntoIterator<Item = Api>) -> Native {
        Native(apis.into_iter().fold(0, |bits, api| bits | api.bit()))
    }

    pub fn passes(self, api: Api) -> bool {
        self.0 & api.bit() != 0
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AuthHeader {
    #[default]
    Authorization,
    XApiKey,
}

/// The request fields a translation may have no equivalent of in the pool's API, refused with
/// a 400 naming them unless the pool's `drop_params` names them.
pub const DROPPABLE_PARAMS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "n",
    "response_format",
    "modalities",
    "audio",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "prediction",
    "web_search_options",
    "functions",
    "function_call",
    "verbosity",
];

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub upstreams: Vec<UpstreamConfig>,
    pub api_key: Option<Secret>,
    /// The header the credential goes upstream in: `authorization` (`Bearer <key>`) or
    /// `x-api-key` (the bare key, as Anthropic's API takes it).
    pub auth_header: AuthHeader,
    /// The API the pool's upstreams speak.
    pub provider: Provider,
    /// The inbound APIs passed through as they are; the others are translated.
    pub native: Native,
    /// Request fields a translation to this pool leaves out (and names to the client)
    /// instead of refusing: `DROPPABLE_PARAMS` only.
    pub drop_params: Vec<String>,
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
    /// Prompt tokens read from the provider's cache, instead of `prompt` (unset: `prompt`).
    #[serde(default)]
    pub cached_prompt: Option<f64>,
    /// Prompt tokens written to the provider's cache, instead of `prompt`.
    #[serde(default)]
    pub cache_write: Option<f64>,
    /// Reasoning tokens, instead of `completion` (unset: `completion`).
    #[serde(default)]
    pub reasoning: Option<f64>,
}

impl Price {
    /// Every price it sets, for the checks.
    pub fn all(&self) -> [f64; 6] {
        [
            self.prompt,
            self.completion,
            self.request,
            self.cached_prompt.unwrap_or(0.0),
            self.cache_write.unwrap_or(0.0),
            self.reasoning.unwrap_or(0.0),
        ]
    }

    /// The dearest a prompt and an output token can be (what a reservation holds before the
    /// reply says which kind each token is): a cache write may cost more than a prompt
    /// token, reasoning more than output.
    pub fn worst(&self) -> Price {
        Price {
            prompt: self.prompt.max(self.cache_write.unwrap_or(0.0)),
            completion: self.completion.max(self.reasoning.unwrap_or(0.0)),
            request: self.request,
            cached_prompt: None,
            cache_write: None,
            reasoning: None,
        }
    }
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
    /// Other ids that name this model (listed by `/v1/models`).
    pub aliases: Vec<String>,
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
