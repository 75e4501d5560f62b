//! `[cors]`: its raw form as serde reads it, and its check.

use serde::Deserialize;
use toml::Spanned;

use super::raw::*;
use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCors {
    pub(super) allow_origins: Vec<String>,
    pub(super) allow_methods: Option<Vec<String>>,
    pub(super) allow_headers: Option<Vec<String>>,
    #[serde(default, deserialize_with = "duration_s")]
    pub(super) max_age_seconds: Option<u64>,
}

/// `[cors]`: the origins, methods and headers browsers may use.
pub(super) fn check(
    raw: Option<&Spanned<RawCors>>,
    src: &Src<'_>,
    p: &mut Problems,
) -> Option<crate::web::cors::Cors> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    raw.and_then(|c| {
        let r = c.get_ref();
        crate::web::cors::Cors::new(
            &r.allow_origins,
            r.allow_methods.as_deref(),
            r.allow_headers.as_deref(),
            r.max_age_seconds.unwrap_or(600),
        )
        .map_err(|m| p.push(Problem::new(file, at(c.span()), "cors", m)))
        .ok()
    })
}
