//! `[keys]`: where the keys live (a keys file beside the config, or the Postgres store's
//! `keys` table); its check.

use std::path::PathBuf;

use super::raw::RawKeysRef;
use super::*;

/// `[keys]`.
#[derive(Debug, Clone)]
pub struct KeysConfig {
    /// The keys file (with keys in Postgres, only the default of `keys import`).
    pub file: PathBuf,
    /// `source = "postgres"`: the keys live in the Postgres store's `keys` table.
    pub in_postgres: bool,
}

/// `[keys]`; `postgres` is `[storage] postgres`, which `source = "postgres"` needs.
pub(super) fn check(
    raw: &RawKeysRef,
    postgres: bool,
    src: &Src<'_>,
    p: &mut Problems,
) -> KeysConfig {
    let in_postgres = match &raw.source {
        None => false,
        Some(v) => {
            let bad = |m: &str| Problem::new(src.file, src.at(v.span()), "keys.source", m);
            match v.get_ref().as_str() {
                "file" => false,
                "postgres" if postgres => true,
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
    KeysConfig {
        file: src.dir.join(raw.file.as_deref().unwrap_or("keys.toml")),
        in_postgres,
    }
}
