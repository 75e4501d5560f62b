//! Config stage: read `modelgate.toml` → deserialize strictly (`deny_unknown_fields`) →
//! validate → typed `Config`. Every problem found names file, line and field; loading never
//! stops at the first one. Relative paths resolve against the config file's folder.

pub mod headers;
pub mod keys;
pub mod keys_db;
pub mod keys_file;
pub mod live;
mod problem;
mod raw;
pub mod reload;
mod types;
mod upstream_url;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

pub use problem::{Problem, Problems};
use raw::*;
pub use types::*;
use upstream_url::parse_upstream_url;

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
            let files = crate::http1::tls::TlsFiles {
                cert: dir.join(&raw_files.get_ref().cert),
                key: dir.join(&raw_files.get_ref().key),
            };
            if let Err(e) = crate::http1::tls::load(&files) {
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
            let max_output_tokens = match &rm.max_output_tokens {
                None => DEFAULT_MAX_OUTPUT_TOKENS,
                Some(m) => {
                    if *m.get_ref() == 0 || *m.get_ref() > 100_000_000 {
                        p.push(Problem::new(
                            &file,
                            at(m.span()),
                            &format!("models[{i}].max_output_tokens"),
                            "must be from 1 to 100000000",
                        ));
                    }
                    *m.get_ref()
                }
            };
            models.push(ModelConfig {
                owned_by,
                max_output_tokens,
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
        let trusted_proxies: Vec<crate::auth::client::Cidr> = server
            .as_ref()
            .and_then(|s| s.trusted_proxies.as_ref())
            .map(|list| {
                list.get_ref()
                    .iter()
                    .filter_map(|v| match crate::auth::client::Cidr::parse(v) {
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
            crate::web::cors::Cors::new(
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
            endpoint_ok.then(|| crate::ops::telemetry::TelemetryConfig {
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
        // An option's value, one of `choices` (the first is its default).
        let mut choose = |v: Option<&Spanned<String>>, field: &str, choices: &[(&str, u8)]| {
            let Some(v) = v else { return choices[0].1 };
            match choices.iter().find(|(name, _)| name == v.get_ref()) {
                Some((_, c)) => *c,
                None => {
                    let names: Vec<String> =
                        choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                    let message = format!("must be {}", names.join(" or "));
                    p.push(Problem::new(&file, at(v.span()), field, message));
                    choices[0].1
                }
            }
        };
        let finish_when_gone = choose(
            server.as_ref().and_then(|s| s.on_client_gone.as_ref()),
            "server.on_client_gone",
            &[("finish", 0), ("cancel", 1)],
        ) == 0;
        let limits = raw.limits.as_ref();
        let on_redis_down = match choose(
            limits.and_then(|l| l.on_redis_down.as_ref()),
            "limits.on_redis_down",
            &[("local", 0), ("deny", 1)],
        ) {
            0 => crate::limit::shared::OnDown::Local,
            _ => crate::limit::shared::OnDown::Deny,
        };
        let budget_mode = match choose(
            limits.and_then(|l| l.budget_mode.as_ref()),
            "limits.budget_mode",
            &[("reserve", 0), ("after", 1)],
        ) {
            0 => BudgetMode::Reserve,
            _ => BudgetMode::After,
        };
        let on_store_full = match choose(
            raw.storage.as_ref().and_then(|s| s.on_store_full.as_ref()),
            "storage.on_store_full",
            &[("refuse", 0), ("serve", 1)],
        ) {
            0 => OnStoreFull::Refuse,
            _ => OnStoreFull::Serve,
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
            journal: match raw.storage.as_ref().and_then(|s| s.journal.clone()) {
                Some(off) if off == "off" => None,
                j => Some(dir.join(j.unwrap_or_else(|| "usage-journal".into()))),
            },
            retention: raw
                .storage
                .as_ref()
                .and_then(|s| s.retention_days)
                .filter(|d| *d > 0)
                .map(|d| Duration::from_secs(d * 86_400)),
            on_store_full,
            memory_max_records: raw
                .storage
                .as_ref()
                .and_then(|s| s.memory_max_records)
                .map_or(200_000, |n| usize::try_from(n.max(1)).unwrap_or(usize::MAX)),
            spool_max_bytes: raw
                .storage
                .as_ref()
                .and_then(|s| s.spool_max_bytes)
                .unwrap_or(1 << 30),
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
                .unwrap_or(crate::auth::throttle::FAILURES_PER_WINDOW),
            telemetry,
            redis,
            on_redis_down,
            budget_mode,
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
            finish_when_gone,
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
            access_log_file: raw
                .log
                .as_ref()
                .and_then(|l| l.access_file.as_ref())
                .map(|f| dir.join(f)),
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
) -> (f64, crate::ops::access_log::Format) {
    use crate::ops::access_log::Format;
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

/// Both API listeners are one Pingora service with one runtime of `threads` threads: by
/// default one a core, whichever listener gets the traffic.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests;
