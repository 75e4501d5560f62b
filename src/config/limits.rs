//! `[limits]`: its raw form as serde reads it, and its check.

use serde::Deserialize;
use toml::Spanned;

use super::raw::*;
use super::*;

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

/// `[limits] redis`: the URL of the Redis the fleet shares limits in.
pub(super) fn redis(raw: Option<&RawLimits>, src: &Src<'_>, p: &mut Problems) -> Option<Secret> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    raw.and_then(|l| {
        let url = l.redis.as_ref()?;
        let bad = |m: String| Problem::new(file, at(url.span()), "limits.redis", m);
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
    })
}

/// What a gateway does while Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDown {
    /// Each gateway counts its own limits (a key may get up to N× its limits across N).
    Local,
    /// Requests of keys with limits or a budget are refused (503) until Redis is back.
    Deny,
}

/// Failed attempts allowed per address per window.
pub const FAILURES_PER_WINDOW: usize = 10;
