//! The config file as written: the TOML sections as serde reads them (unknown fields refused,
//! spans kept for the problems' lines), before `Config::parse` checks and types them.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::Price;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listeners: RawListeners,
    pub(super) keys: RawKeysRef,
    pub(super) storage: Option<RawStorage>,
    #[serde(default)]
    pub(super) pools: Vec<RawPool>,
    #[serde(default)]
    pub(super) models: Vec<RawModel>,
    pub(super) demo: Option<RawDemo>,
    pub(super) console: Option<Spanned<RawConsole>>,
    pub(super) limits: Option<RawLimits>,
    pub(super) server: Option<RawServer>,
    pub(super) log: Option<RawLog>,
    pub(super) cors: Option<Spanned<RawCors>>,
    pub(super) metrics: Option<RawMetrics>,
    pub(super) telemetry: Option<Spanned<RawTelemetry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub(super) otlp_endpoint: Spanned<String>,
    pub(super) service_name: Option<String>,
    pub(super) sample_rate: Option<Spanned<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    /// Per-key series (one per key id: mind the cardinality).
    pub(super) key_label: Option<bool>,
}

/// The highest price (credits per 1M tokens, or per request): with the largest token count
/// believed (1e8), a cost stays a plain number (a price near f64's limit made it infinite,
/// which spent every budget for good and could not be stored).
pub const MAX_PRICE: f64 = 1e9;

/// The longest duration the config takes: a week. Every deadline made from one stays far
/// from overflowing a clock (a `grace_period_seconds` near `u64::MAX` panicked at shutdown).
pub(super) const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

pub(super) fn bounded<'de, D: serde::Deserializer<'de>>(
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
pub(super) fn duration_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "ms", MAX_DURATION.as_millis() as u64)
}

/// `retention_days`: at most a hundred years (a huge number overflowed into a short retention,
/// which would have deleted the records).
pub(super) fn retention_days<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    let v = Option::<u64>::deserialize(d)?;
    match v {
        Some(n) if n > 36_500 => Err(serde::de::Error::custom(format!(
            "{n} days is more than a hundred years (36500)"
        ))),
        v => Ok(v),
    }
}

/// A duration in seconds (`*_seconds`), at most `MAX_DURATION`.
pub(super) fn duration_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "seconds", MAX_DURATION.as_secs())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCors {
    pub(super) allow_origins: Vec<String>,
    pub(super) allow_methods: Option<Vec<String>>,
    pub(super) allow_headers: Option<Vec<String>>,
    #[serde(default, deserialize_with = "duration_s")]
    pub(super) max_age_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    /// "on", "off", or a sample rate in 0..=1.
    pub(super) access: Option<Spanned<toml::Value>>,
    /// "json" (default) or "logfmt".
    pub(super) format: Option<Spanned<String>>,
    /// The access log to a file (appended) instead of stdout.
    pub(super) access_file: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListeners {
    pub(super) main: Option<Spanned<String>>,
    pub(super) direct: Option<Spanned<String>>,
    pub(super) admin: Option<Spanned<String>>,
    pub(super) tls: Option<RawListenersTls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListenersTls {
    pub(super) main: Option<Spanned<RawTlsFiles>>,
    pub(super) direct: Option<Spanned<RawTlsFiles>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTlsFiles {
    pub(super) cert: String,
    pub(super) key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKeysRef {
    pub(super) file: Option<String>,
    pub(super) source: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorage {
    pub(super) sqlite: Option<String>,
    pub(super) postgres: Option<Spanned<String>>,
    pub(super) spool: Option<String>,
    pub(super) journal: Option<String>,
    pub(super) on_store_full: Option<Spanned<String>>,
    pub(super) memory_max_records: Option<u64>,
    pub(super) spool_max_bytes: Option<u64>,
    #[serde(default, deserialize_with = "retention_days")]
    pub(super) retention_days: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub(super) name: Spanned<String>,
    pub(super) upstreams: Spanned<Vec<Spanned<RawUpstream>>>,
    pub(super) api_key: Option<Spanned<String>>,
    pub(super) auth_header: Option<Spanned<String>>,
    pub(super) strategy: Option<Spanned<String>>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) connect_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) read_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) first_byte_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) idle_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) keepalive_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) request_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) health_interval_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) cooldown_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) retry_base_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) retry_cap_ms: Option<u64>,
    pub(super) max_attempts: Option<Spanned<u32>>,
    pub(super) pass_headers: Option<Spanned<Vec<String>>>,
}

/// An upstream: its base URL, or `{ url = "…", weight = 2, api_key = "env:…" }`.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawUpstream {
    Url(String),
    Full(RawUpstreamTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstreamTable {
    pub(super) url: String,
    pub(super) weight: Option<u32>,
    pub(super) api_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub(super) name: Spanned<String>,
    pub(super) pool: Spanned<String>,
    pub(super) upstream_model: Option<String>,
    pub(super) price: Option<Spanned<Price>>,
    pub(super) fallbacks: Option<Spanned<Vec<String>>>,
    pub(super) owned_by: Option<Spanned<String>>,
    pub(super) max_output_tokens: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDemo {
    pub(super) mock_upstream: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsole {
    pub(super) user: String,
    pub(super) password_hash: Option<Spanned<String>>,
    pub(super) password: Option<Spanned<String>>,
    pub(super) public_origin: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) max_body_bytes: Option<usize>,
    pub(super) auth_failures_per_minute: Option<usize>,
    pub(super) redis: Option<Spanned<String>>,
    pub(super) on_redis_down: Option<Spanned<String>>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) redis_timeout_ms: Option<u64>,
    pub(super) budget_mode: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) threads: Option<usize>,
    pub(super) trusted_proxies: Option<Spanned<Vec<String>>>,
    #[serde(default, deserialize_with = "duration_s")]
    pub(super) grace_period_seconds: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) shutdown_delay_ms: Option<u64>,
    pub(super) upgrade_sock: Option<String>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) client_header_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) client_body_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) client_send_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) keepalive_timeout_ms: Option<u64>,
    pub(super) on_client_gone: Option<Spanned<String>>,
}
