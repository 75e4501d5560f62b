//! `[[pools]]`: its raw form as serde reads it, and its check.

use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::raw::*;
use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub(super) name: Spanned<String>,
    pub(super) upstreams: Spanned<Vec<Spanned<RawUpstream>>>,
    pub(super) api_key: Option<Spanned<String>>,
    pub(super) auth_header: Option<Spanned<String>>,
    pub(super) provider: Option<Spanned<String>>,
    pub(super) native: Option<Spanned<Vec<String>>>,
    pub(super) drop_params: Option<Spanned<Vec<String>>>,
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

/// `[[pools]]`: names, upstreams (URLs, weights, keys), balancing, timeouts, retries; also
/// the pool names, for the models to name.
pub(super) fn check(
    raw: &[RawPool],
    src: &Src<'_>,
    p: &mut Problems,
) -> (Vec<PoolConfig>, HashSet<String>) {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    let mut pools = Vec::new();
    let mut pool_names = HashSet::new();
    for (i, rp) in raw.iter().enumerate() {
        let field = |f: &str| format!("pools[{i}].{f}");
        let name = rp.name.get_ref().clone();
        if name.is_empty() || !pool_names.insert(name.clone()) {
            p.push(Problem::new(
                file,
                at(rp.name.span()),
                &field("name"),
                format!("duplicate or empty pool name '{name}'"),
            ));
        }
        if rp.upstreams.get_ref().is_empty() {
            p.push(Problem::new(
                file,
                at(rp.upstreams.span()),
                &field("upstreams"),
                "needs at least one upstream URL",
            ));
        }
        let upstreams = upstreams(rp, &field, src, p);
        let (provider, native) = provider(rp, &field, src, p);
        let drop_params = drop_params(rp, &field, src, p);
        let (strategy, auth_header) = balancing(rp, &field, src, p);
        // Anthropic's API takes the key in `x-api-key`.
        let auth_header = match (provider, &rp.auth_header) {
            (Provider::Anthropic, None) => AuthHeader::XApiKey,
            _ => auth_header,
        };
        let max_attempts = rp.max_attempts.as_ref().map_or(3, |m| *m.get_ref());
        if !(1..=10).contains(&max_attempts) {
            p.push(Problem::new(
                file,
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
                    p.push(Problem::new(file, at(k.span()), &field("api_key"), m));
                    None
                }
            },
        };
        let pass_headers = match &rp.pass_headers {
            None => headers::PassHeaders::default(),
            Some(names) => headers::PassHeaders::parse(names.get_ref()).unwrap_or_else(|m| {
                p.push(Problem::new(
                    file,
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
            provider,
            native,
            drop_params,
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
    (pools, pool_names)
}

/// A pool's upstreams: each URL with its weight and own key, where it is written.
fn upstreams(
    rp: &RawPool,
    field: &dyn Fn(&str) -> String,
    src: &Src<'_>,
    p: &mut Problems,
) -> Vec<UpstreamConfig> {
    let (file, at) = (src.file, |s: std::ops::Range<usize>| src.at(s));
    let mut upstreams = Vec::new();
    for u in rp.upstreams.get_ref() {
        let (url, weight, key) = match u.get_ref() {
            RawUpstream::Url(url) => (url, 1, None),
            RawUpstream::Full(t) => (&t.url, t.weight.unwrap_or(1), t.api_key.as_ref()),
        };
        let mut problem = |m: String| {
            p.push(Problem::new(file, at(u.span()), &field("upstreams"), m));
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
    upstreams
}

/// A pool's balancing strategy and the header its credential goes in.
fn balancing(
    rp: &RawPool,
    field: &dyn Fn(&str) -> String,
    src: &Src<'_>,
    p: &mut Problems,
) -> (Strategy, AuthHeader) {
    let (file, at) = (src.file, |s: std::ops::Range<usize>| src.at(s));
    let strategy = match rp.strategy.as_ref().map(|s| s.get_ref().as_str()) {
        None | Some("round_robin") => Strategy::RoundRobin,
        Some("weighted") => Strategy::Weighted,
        Some("least_connections") => Strategy::LeastConnections,
        Some(other) => {
            p.push(Problem::new(
                file,
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
                file,
                rp.auth_header.as_ref().and_then(|s| at(s.span())),
                &field("auth_header"),
                format!("'{other}' is not one of authorization, x-api-key"),
            ));
            AuthHeader::Authorization
        }
    };
    (strategy, auth_header)
}

/// A pool's provider and the inbound APIs it passes through (`native`). An Anthropic pool
/// takes only the Messages API as it is.
fn provider(
    rp: &RawPool,
    field: &dyn Fn(&str) -> String,
    src: &Src<'_>,
    p: &mut Problems,
) -> (Provider, Native) {
    let (file, at) = (src.file, |s: std::ops::Range<usize>| src.at(s));
    let provider = match rp.provider.as_ref().map(|s| s.get_ref().as_str()) {
        None => Provider::OpenAi,
        Some(name) => match Provider::ALL.into_iter().find(|k| k.name() == name) {
            Some(k) => k,
            None => {
                let later = ["gemini", "vertex", "bedrock", "azure"];
                let why = if later.contains(&name) {
                    format!("'{name}' is not supported yet: one of openai, anthropic")
                } else {
                    format!("'{name}' is not one of openai, anthropic")
                };
                p.push(Problem::new(
                    file,
                    rp.provider.as_ref().and_then(|s| at(s.span())),
                    &field("provider"),
                    why,
                ));
                Provider::OpenAi
            }
        },
    };
    let Some(names) = &rp.native else {
        return (provider, provider.default_native());
    };
    let mut apis = Vec::new();
    for name in names.get_ref() {
        let why = match Api::parse(name) {
            None => {
                let all: Vec<&str> = Api::ALL.iter().map(|a| a.name()).collect();
                format!("'{name}' is not one of {}", all.join(", "))
            }
            Some(api) if provider == Provider::Anthropic && api != Api::Messages => format!(
                "an anthropic pool speaks only the Messages API: '{name}' arrives translated"
            ),
            Some(api) => {
                apis.push(api);
                continue;
            }
        };
        p.push(Problem::new(file, at(names.span()), &field("native"), why));
    }
    (provider, Native::of(apis))
}

/// The request fields a translation to this pool leaves out instead of refusing
/// (`drop_params`): only fields a translation can refuse.
fn drop_params(
    rp: &RawPool,
    field: &dyn Fn(&str) -> String,
    src: &Src<'_>,
    p: &mut Problems,
) -> Vec<String> {
    let Some(names) = &rp.drop_params else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names.get_ref() {
        if DROPPABLE_PARAMS.contains(&name.as_str()) {
            out.push(name.clone());
            continue;
        }
        let why = format!(
            "'{name}' is not a parameter a translation refuses: one of {}",
            DROPPABLE_PARAMS.join(", ")
        );
        p.push(Problem::new(
            src.file,
            src.at(names.span()),
            &field("drop_params"),
            why,
        ));
    }
    out
}
