//! Config stage: read `modelgate.toml` → deserialize strictly (`deny_unknown_fields`) →
//! validate → typed `Config`, one file a section (its raw form and its check), the parse a
//! list of section calls. Every problem found names file, line and field; loading never stops
//! at the first one. Relative paths resolve against the config file's folder.

mod console;
mod cors;
pub mod headers;
pub mod keys;
pub mod keys_file;
mod keys_source;
mod limits;
mod listeners;
pub use listeners::Listener;
mod log;
mod models;
mod pools;
mod problem;
mod raw;
mod routing;
mod server;
mod storage;
mod telemetry;
mod types;
mod upstream_url;

use std::path::{Path, PathBuf};

use toml::Spanned;

pub use cors::Cors;
pub use keys_source::KeysConfig;
pub use limits::{FAILURES_PER_WINDOW, Limits, OnDown};
pub use listeners::{Loaded, TlsFiles, load_tls};
pub use log::Log;
pub use models::{MAX_MODEL_LEN, is_glob};
pub use problem::{Problem, Problems};
use raw::*;
pub use server::{Cidr, Server};
pub use storage::Storage;
pub use telemetry::MetricsConfig;
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
        let src = &Src {
            file: &file,
            text,
            dir: &dir,
        };
        let p = &mut p;
        let (listeners, bound) = listeners::check(&raw.listeners, src, p);
        let (pools, pool_names) = pools::check(&raw.pools, src, p);
        let storage = storage::check(raw.storage.as_ref(), src, p);
        let fixed = Fixed {
            path: path.to_path_buf(),
            demo_mock_upstream: listeners::demo(raw.demo.as_ref(), &bound, src, p),
            listeners,
            keys: keys_source::check(&raw.keys, storage.postgres.is_some(), src, p),
            storage,
            server: server::check(raw.server.as_ref(), src, p),
            limits: limits::check(raw.limits.as_ref(), src, p),
            log: log::check(raw.log.as_ref(), src, p),
            cors: cors::check(raw.cors.as_ref(), src, p),
            metrics: telemetry::metrics(raw.metrics.as_ref()),
            telemetry: telemetry::check(raw.telemetry.as_ref(), src, p),
        };
        let models = models::check(&raw.models, &pool_names, src, p);
        let live = LiveConfig {
            default_model: routing::check(raw.routing.as_ref(), &models, src, p),
            models,
            pools,
            console: console::check(raw.console, src, p),
        };
        let problems = std::mem::take(p).after_shape(shape);
        Ok((Config { fixed, live }, problems))
    }
}

/// An option's value: the one of `choices` (name, value) it names; the first is the default.
fn choose<T: Copy>(
    v: Option<&Spanned<String>>,
    field: &str,
    choices: &[(&str, T)],
    src: &Src<'_>,
    p: &mut Problems,
) -> T {
    let default = choices[0].1;
    let Some(v) = v else { return default };
    match choices.iter().find(|(name, _)| name == v.get_ref()) {
        Some((_, value)) => *value,
        None => {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
            let message = format!("must be {}", names.join(" or "));
            p.push(Problem::new(src.file, src.at(v.span()), field, message));
            default
        }
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
