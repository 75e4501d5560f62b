//! The config file as written: the TOML sections as serde reads them (unknown fields refused,
//! spans kept for the problems' lines), before `Config::parse` checks and types them.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::console::RawConsole;
use super::cors::RawCors;
use super::limits::RawLimits;
use super::listeners::RawListeners;
use super::log::RawLog;
use super::models::RawModel;
use super::pools::RawPool;
use super::routing::RawRouting;
use super::server::RawServer;
use super::storage::RawStorage;
use super::telemetry::RawTelemetry;

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
    pub(super) routing: Option<RawRouting>,
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
pub(super) struct RawKeysRef {
    pub(super) file: Option<String>,
    pub(super) source: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDemo {
    pub(super) mock_upstream: Option<Spanned<String>>,
}
