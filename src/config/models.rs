//! `[[models]]`: its raw form as serde reads it, and its check.

use std::collections::HashSet;

use serde::Deserialize;
use toml::Spanned;

use super::raw::*;
use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub(super) name: Spanned<String>,
    pub(super) pool: Spanned<String>,
    pub(super) upstream_model: Option<String>,
    pub(super) price: Option<Spanned<Price>>,
    pub(super) fallbacks: Option<Spanned<Vec<String>>>,
    pub(super) owned_by: Option<Spanned<String>>,
    pub(super) max_output_tokens: Option<Spanned<u64>>,
    pub(super) aliases: Option<Spanned<Vec<String>>>,
}

/// `[[models]]`: names (unique, within the longest a request may give), pools, prices,
/// fallbacks (other configured models).
pub(super) fn check(
    raw: &[RawModel],
    pool_names: &HashSet<String>,
    src: &Src<'_>,
    p: &mut Problems,
) -> Vec<ModelConfig> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    let mut models = Vec::new();
    let mut model_names = HashSet::new();
    for (i, rm) in raw.iter().enumerate() {
        let name = rm.name.get_ref().clone();
        check_names(i, rm, &mut model_names, pool_names, src, p);
        let price = rm.price.as_ref().map(|s| *s.get_ref()).unwrap_or_default();
        if let Some(s) = &rm.price {
            if price
                .all()
                .iter()
                .any(|v| !v.is_finite() || *v < 0.0 || *v > MAX_PRICE)
            {
                p.push(Problem::new(
                    file,
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
                        file,
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
                        file,
                        at(m.span()),
                        &format!("models[{i}].max_output_tokens"),
                        "must be from 1 to 100000000",
                    ));
                }
                *m.get_ref()
            }
        };
        // A glob sends the id asked for, unless `upstream_model` says otherwise.
        let default_upstream = if is_glob(&name) {
            "{model}".to_string()
        } else {
            name.clone()
        };
        models.push(ModelConfig {
            owned_by,
            max_output_tokens,
            upstream_model: rm.upstream_model.clone().unwrap_or(default_upstream),
            aliases: rm
                .aliases
                .as_ref()
                .map(|a| a.get_ref().clone())
                .unwrap_or_default(),
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

    check_aliases(raw, &mut model_names, src, p);
    for (i, (rm, m)) in raw.iter().zip(&models).enumerate() {
        for f in &m.fallbacks {
            if f == &m.name || m.aliases.contains(f) || is_glob(f) || !model_names.contains(f) {
                p.push(Problem::new(
                    file,
                    rm.fallbacks.as_ref().and_then(|f| at(f.span())),
                    &format!("models[{i}].fallbacks"),
                    format!("'{f}' is not another configured model (a name or an alias)"),
                ));
            }
        }
    }
    models
}

/// Whether a model entry's name is a glob (`claude-*`): it takes every id it matches.
pub fn is_glob(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

/// Each model's aliases: other ids for it, each unique among names and aliases, none a glob.
fn check_aliases(raw: &[RawModel], names: &mut HashSet<String>, src: &Src<'_>, p: &mut Problems) {
    for (i, rm) in raw.iter().enumerate() {
        let Some(aliases) = &rm.aliases else { continue };
        for a in aliases.get_ref() {
            let why = if a.is_empty() || a.len() > MAX_MODEL_LEN {
                Some(format!("alias '{a}' must be 1 to {MAX_MODEL_LEN} bytes"))
            } else if is_glob(a) {
                Some(format!(
                    "alias '{a}' is a glob: make it a model entry's name"
                ))
            } else if !names.insert(a.clone()) {
                Some(format!("alias '{a}' is already a model's name or alias"))
            } else {
                None
            };
            if let Some(why) = why {
                let field = format!("models[{i}].aliases");
                p.push(Problem::new(src.file, src.at(aliases.span()), &field, why));
            }
        }
    }
}

/// Longest model name accepted: longer ones are refused rather than stored in every record.
pub const MAX_MODEL_LEN: usize = 256;

/// A model's name (unique, not too long) and the pool it names (configured).
fn check_names(
    i: usize,
    rm: &RawModel,
    model_names: &mut HashSet<String>,
    pool_names: &HashSet<String>,
    src: &Src<'_>,
    p: &mut Problems,
) {
    let (file, at) = (src.file, |s: std::ops::Range<usize>| src.at(s));
    let name = rm.name.get_ref().clone();
    if name.is_empty() || !model_names.insert(name.clone()) {
        p.push(Problem::new(
            file,
            at(rm.name.span()),
            &format!("models[{i}].name"),
            format!("duplicate or empty model name '{name}'"),
        ));
    }
    if name.len() > MAX_MODEL_LEN {
        p.push(Problem::new(
            file,
            at(rm.name.span()),
            &format!("models[{i}].name"),
            format!(
                "longer than {} bytes, the longest model name a request may \
                 give",
                MAX_MODEL_LEN
            ),
        ));
    }
    if !pool_names.contains(rm.pool.get_ref()) {
        p.push(Problem::new(
            file,
            at(rm.pool.span()),
            &format!("models[{i}].pool"),
            format!("no pool named '{}'", rm.pool.get_ref()),
        ));
    }
    if is_glob(&name) {
        if let Err(e) = globset::Glob::new(&name) {
            p.push(Problem::new(
                file,
                at(rm.name.span()),
                &format!("models[{i}].name"),
                format!("bad glob '{name}': {e}"),
            ));
        }
    }
}
