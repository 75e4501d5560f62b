//! `[routing]`: what the router does with an id no model entry matches; its raw form and its
//! check.

use serde::Deserialize;
use toml::Spanned;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRouting {
    pub(super) default_model: Option<Spanned<String>>,
}

/// Whether `id` names one of `models`: a name, an alias, or an id a glob entry matches.
fn names_a_model(models: &[ModelConfig], id: &str) -> bool {
    models.iter().any(|m| {
        m.name == id
            || m.aliases.iter().any(|a| a == id)
            || (models::is_glob(&m.name)
                && globset::Glob::new(&m.name).is_ok_and(|g| g.compile_matcher().is_match(id)))
    })
}

/// `[routing] default_model`: it must name a configured model.
pub(super) fn check(
    raw: Option<&RawRouting>,
    models: &[ModelConfig],
    src: &Src<'_>,
    p: &mut Problems,
) -> Option<String> {
    let d = raw?.default_model.as_ref()?;
    if !names_a_model(models, d.get_ref()) {
        p.push(Problem::new(
            src.file,
            src.at(d.span()),
            "routing.default_model",
            format!("'{}' is not a configured model", d.get_ref()),
        ));
    }
    Some(d.get_ref().clone())
}
