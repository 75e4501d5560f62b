//! `[limits]`: its raw form as serde reads it, and its check.

use std::time::Duration;

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

/// `[limits]`: what any one request or client may take, and where a fleet shares its counts.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// Wrong keys one client address may present a minute before it gets 429 (on `/v1`, the
    /// usage APIs and the page alike); 0: no limit.
    pub auth_failures_per_minute: usize,
    /// rpm, tpm, concurrency and spend shared by every gateway using this Redis.
    pub redis: Option<Secret>,
    /// What happens while Redis cannot be reached.
    pub on_redis_down: OnDown,
    /// The longest a request waits for Redis.
    pub redis_timeout: Duration,
    /// When a budget is checked against a request's cost.
    pub budget_mode: BudgetMode,
}

pub(super) fn check(raw: Option<&RawLimits>, src: &Src<'_>, p: &mut Problems) -> Limits {
    let on_redis_down = choose(
        raw.and_then(|l| l.on_redis_down.as_ref()),
        "limits.on_redis_down",
        &[("local", OnDown::Local), ("deny", OnDown::Deny)],
        src,
        p,
    );
    let budget_mode = choose(
        raw.and_then(|l| l.budget_mode.as_ref()),
        "limits.budget_mode",
        &[
            ("reserve", BudgetMode::Reserve),
            ("after", BudgetMode::After),
        ],
        src,
        p,
    );
    Limits {
        max_body_bytes: raw
            .and_then(|l| l.max_body_bytes)
            .unwrap_or(DEFAULT_MAX_BODY_BYTES),
        auth_failures_per_minute: raw
            .and_then(|l| l.auth_failures_per_minute)
            .unwrap_or(FAILURES_PER_WINDOW),
        redis: redis(raw, src, p),
        on_redis_down,
        redis_timeout: Duration::from_millis(
            raw.and_then(|l| l.redis_timeout_ms).unwrap_or(250).max(1),
        ),
        budget_mode,
    }
}

/// `[limits] redis`: the URL of the Redis the fleet shares limits in.
fn redis(raw: Option<&RawLimits>, src: &Src<'_>, p: &mut Problems) -> Option<Secret> {
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
