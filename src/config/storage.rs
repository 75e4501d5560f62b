//! `[storage]`: its raw form as serde reads it, and its check.

use serde::Deserialize;
use toml::Spanned;

use super::raw::*;
use super::*;

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

/// `[storage] postgres`: a URL or settings, literal or from the environment, instead of SQLite.
pub(super) fn postgres(
    raw: Option<&RawStorage>,
    src: &Src<'_>,
    p: &mut Problems,
) -> Option<Secret> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    raw.and_then(|s| {
        let pg = s.postgres.as_ref()?;
        let bad = |m: String| Problem::new(file, at(pg.span()), "storage.postgres", m);
        if s.sqlite.is_some() {
            p.push(bad("set sqlite or postgres, not both".into()));
            return None;
        }
        let secret = resolve_secret(pg.get_ref())
            .map_err(|m| p.push(bad(m)))
            .ok()?;
        check_postgres_url(secret.expose())
            .map_err(|m| p.push(bad(m)))
            .ok()?;
        Some(secret)
    })
}

/// Whether a Postgres connection string (`postgres://…` or `key=value` settings) parses.
pub fn check_postgres_url(url: &str) -> Result<(), String> {
    url.parse::<postgres::Config>()
        .map(drop)
        .map_err(|e| format!("usage store (postgres): the connection string: {e}"))
}
