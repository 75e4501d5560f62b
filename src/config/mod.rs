//! Config stage: read `modelgate.toml` → deserialize strictly (`deny_unknown_fields`) →
//! validate → typed `Config`. Every problem found names file, line and field; loading never
//! stops at the first one. Relative paths resolve against the config file's folder.

mod console;
mod cors;
pub mod headers;
pub mod keys;
pub mod keys_file;
mod limits;
mod listeners;
pub use listeners::Listener;
mod log;
mod models;
mod pools;
mod problem;
mod raw;
mod server;
mod storage;
mod telemetry;
mod types;
mod upstream_url;

use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

pub use cors::Cors;
pub use limits::{FAILURES_PER_WINDOW, OnDown};
pub use listeners::{Loaded, TlsFiles, load_tls};
pub use models::MAX_MODEL_LEN;
pub use problem::{Problem, Problems};
use raw::*;
pub use server::Cidr;
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
        let src = Src {
            file: &file,
            text,
            dir: &dir,
        };

        let (listeners, bound) = listeners::check(&raw.listeners, &src, &mut p);

        let (pools, pool_names) = pools::check(&raw.pools, &src, &mut p);

        let models = models::check(&raw.models, &pool_names, &src, &mut p);

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
                    src.at(m.span()),
                    "demo.mock_upstream",
                    message,
                ));
            }
            m.into_inner()
        });

        let console = console::check(raw.console, &src, &mut p);

        let server = raw.server;
        let trusted_proxies = server::trusted_proxies(server.as_ref(), &src, &mut p);

        let cors = cors::check(raw.cors.as_ref(), &src, &mut p);

        let telemetry = telemetry::check(raw.telemetry.as_ref(), &src, &mut p);

        let (access_log_rate, access_log_format) = log::check(raw.log.as_ref(), &src, &mut p);
        let postgres = storage::postgres(raw.storage.as_ref(), &src, &mut p);

        let redis = limits::redis(raw.limits.as_ref(), &src, &mut p);

        // An option's value, one of `choices` (the first is its default).
        let mut choose = |v: Option<&Spanned<String>>, field: &str, choices: &[(&str, u8)]| {
            let Some(v) = v else { return choices[0].1 };
            match choices.iter().find(|(name, _)| name == v.get_ref()) {
                Some((_, c)) => *c,
                None => {
                    let names: Vec<String> =
                        choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                    let message = format!("must be {}", names.join(" or "));
                    p.push(Problem::new(&file, src.at(v.span()), field, message));
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
            0 => OnDown::Local,
            _ => OnDown::Deny,
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
                let bad = |m: &str| Problem::new(&file, src.at(v.span()), "keys.source", m);
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
                .unwrap_or(FAILURES_PER_WINDOW),
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

/// The file being checked: its name and text (for the problems' lines) and its folder (for
/// the relative paths in it).
pub(super) struct Src<'a> {
    pub file: &'a str,
    pub text: &'a str,
    pub dir: &'a Path,
}

impl Src<'_> {
    /// The line of a span's start.
    pub fn at(&self, span: std::ops::Range<usize>) -> Option<usize> {
        Some(problem::line_of(self.text, span.start))
    }
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

/// What identifies a version of the file, following symlinks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(Option<(std::time::SystemTime, u64, u64)>);

pub fn fingerprint(path: &Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    Fingerprint(std::fs::metadata(path).ok().map(|m| {
        (
            m.modified().unwrap_or(std::time::UNIX_EPOCH),
            m.len(),
            m.ino(),
        )
    }))
}

#[cfg(test)]
mod tests;
