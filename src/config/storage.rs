//! `[storage]`: its raw form as serde reads it, and its check.

use std::path::PathBuf;
use std::time::Duration;

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

/// `[storage]`: where records are kept, and what waits where while they cannot be.
#[derive(Debug, Clone)]
pub struct Storage {
    /// The usage store (default `usage.db` beside the config file).
    pub sqlite: PathBuf,
    /// The fleet's store instead of `sqlite`: a `postgres://…` URL or `key=value` settings.
    pub postgres: Option<Secret>,
    /// Where records wait on disk while Postgres is away (default `usage-spool.jsonl` beside
    /// the config file).
    pub spool: PathBuf,
    /// The folder of the journal each request's record goes to before the store has it, so a
    /// crash loses none (default `usage-journal` beside the config); None: `"off"`.
    pub journal: Option<PathBuf>,
    /// Usage records older than this are deleted; None keeps them forever.
    pub retention: Option<Duration>,
    /// What happens once records that cannot be stored fill their bounds.
    pub on_store_full: OnStoreFull,
    /// Records that may wait in memory (default 200,000).
    pub memory_max_records: usize,
    /// Bytes that may wait in the spool (default 1 GiB).
    pub spool_max_bytes: u64,
}

/// `[storage]`, its paths relative to the config file's folder.
pub(super) fn check(raw: Option<&RawStorage>, src: &Src<'_>, p: &mut Problems) -> Storage {
    let dir = src.dir;
    let on_store_full = choose(
        raw.and_then(|s| s.on_store_full.as_ref()),
        "storage.on_store_full",
        &[
            ("refuse", OnStoreFull::Refuse),
            ("serve", OnStoreFull::Serve),
        ],
        src,
        p,
    );
    Storage {
        sqlite: dir.join(
            raw.and_then(|s| s.sqlite.clone())
                .unwrap_or_else(|| "usage.db".into()),
        ),
        postgres: postgres(raw, src, p),
        spool: dir.join(
            raw.and_then(|s| s.spool.clone())
                .unwrap_or_else(|| "usage-spool.jsonl".into()),
        ),
        journal: match raw.and_then(|s| s.journal.clone()) {
            Some(off) if off == "off" => None,
            j => Some(dir.join(j.unwrap_or_else(|| "usage-journal".into()))),
        },
        retention: raw
            .and_then(|s| s.retention_days)
            .filter(|d| *d > 0)
            .map(|d| Duration::from_secs(d * 86_400)),
        on_store_full,
        memory_max_records: raw
            .and_then(|s| s.memory_max_records)
            .map_or(200_000, |n| usize::try_from(n.max(1)).unwrap_or(usize::MAX)),
        spool_max_bytes: raw.and_then(|s| s.spool_max_bytes).unwrap_or(1 << 30),
    }
}

/// `[storage] postgres`: a URL or settings, literal or from the environment, instead of SQLite.
fn postgres(raw: Option<&RawStorage>, src: &Src<'_>, p: &mut Problems) -> Option<Secret> {
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
