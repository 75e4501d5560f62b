//! `[cors]`: its raw form as serde reads it, and its check.

use http::HeaderValue;
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
) -> Option<Cors> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    raw.and_then(|c| {
        let r = c.get_ref();
        Cors::new(
            &r.allow_origins,
            r.allow_methods.as_deref(),
            r.allow_headers.as_deref(),
            r.max_age_seconds.unwrap_or(600),
        )
        .map_err(|m| p.push(Problem::new(file, at(c.span()), "cors", m)))
        .ok()
    })
}

/// `[cors]` checked: the origins allowed and the preflight's answers.
#[derive(Debug, Clone)]
pub struct Cors {
    /// Lowercased origins (`scheme://host[:port]`); empty with `any`.
    pub origins: Vec<String>,
    pub any: bool,
    pub methods: HeaderValue,
    /// None: allow the headers the preflight asks for.
    pub headers: Option<HeaderValue>,
    pub max_age: HeaderValue,
}

impl Cors {
    /// From `[cors]`; an error names what is wrong.
    pub fn new(
        origins: &[String],
        methods: Option<&[String]>,
        headers: Option<&[String]>,
        max_age_seconds: u64,
    ) -> Result<Cors, String> {
        let any = origins.iter().any(|o| o == "*");
        for o in origins.iter().filter(|o| *o != "*") {
            let ok = (o.starts_with("http://") || o.starts_with("https://"))
                && !o
                    .trim_end_matches('/')
                    .contains(|c: char| c.is_whitespace())
                && o.split("://")
                    .nth(1)
                    .is_some_and(|h| !h.is_empty() && !h.contains('/'));
            if !ok {
                return Err(format!(
                    "'{o}' is not an origin like https://app.example.com"
                ));
            }
        }
        let join = |v: &[String]| HeaderValue::from_str(&v.join(", ")).map_err(|e| e.to_string());
        let default_methods = ["GET", "POST", "OPTIONS"].map(String::from);
        Ok(Cors {
            origins: origins.iter().map(|o| o.to_ascii_lowercase()).collect(),
            any,
            methods: join(methods.unwrap_or(&default_methods))?,
            headers: headers.map(join).transpose()?,
            max_age: HeaderValue::from(max_age_seconds),
        })
    }

    /// The `Access-Control-Allow-Origin` value for this `Origin`, if it is allowed.
    pub fn allow(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let origin = origin?;
        if self.any {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin.to_str().ok()?.to_ascii_lowercase();
        self.origins.contains(&o).then(|| origin.clone())
    }
}
