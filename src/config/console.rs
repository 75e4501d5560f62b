//! `[console]`: its raw form as serde reads it, and its check.

use serde::Deserialize;
use toml::Spanned;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsole {
    pub(super) user: String,
    pub(super) password_hash: Option<Spanned<String>>,
    pub(super) password: Option<Spanned<String>>,
    pub(super) public_origin: Option<Spanned<String>>,
}

/// `[console]`: the user, a whole argon2id hash or a password from the environment, the
/// public origin.
pub(super) fn check(
    raw: Option<Spanned<RawConsole>>,
    src: &Src<'_>,
    p: &mut Problems,
) -> Option<ConsoleConfig> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    raw.map(|c| {
        let table_line = at(c.span());
        let c = c.into_inner();
        let password = c
            .password
            .and_then(|pw| match resolve_secret(pw.get_ref()) {
                Ok(s) => Some(s),
                Err(m) => {
                    p.push(Problem::new(file, at(pw.span()), "console.password", m));
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
                    file,
                    at(h.span()),
                    "console.password_hash",
                    "is not an argon2id hash: make one with `modelgate password-hash`",
                ));
            }
        }
        if c.password_hash.is_none() && password.is_none() {
            p.push(Problem::new(
                file,
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
                    file,
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
    })
}
