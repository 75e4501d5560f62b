//! A pool's `pass_headers`: the upstream reply headers its clients get beyond the default set.
//! Checked here (names, and the ones that can never pass); the reply stage asks `allows`.

/// Names (lower case) and name prefixes (`x-foo-*`) a pool passes to its clients.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassHeaders {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl PassHeaders {
    /// Whether the upstream's header `name` (lower case, as `http` keeps names) is named.
    pub fn allows(&self, name: &str) -> bool {
        self.exact.iter().any(|n| n == name) || self.prefixes.iter().any(|p| name.starts_with(&**p))
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// The config's list checked: each entry a header name, or a name's start followed by
    /// `*`. Err names the first entry that cannot be passed, and why.
    pub fn parse(names: &[String]) -> Result<PassHeaders, String> {
        let mut pass = PassHeaders::default();
        for raw in names {
            let lower = raw.trim().to_ascii_lowercase();
            let (stem, prefix) = match lower.strip_suffix('*') {
                Some(stem) => (stem, true),
                None => (lower.as_str(), false),
            };
            let valid = !stem.is_empty() && http::HeaderName::from_bytes(stem.as_bytes()).is_ok();
            if !valid {
                return Err(format!(
                    "'{raw}' is not a header name (or a name's start followed by '*')"
                ));
            }
            if let Some(why) = never_passed(stem, prefix) {
                return Err(format!("'{raw}' cannot be passed: {why}"));
            }
            if prefix {
                pass.prefixes.push(stem.to_string());
            } else {
                pass.exact.push(stem.to_string());
            }
        }
        Ok(pass)
    }
}

/// Why a header (or any header starting with `stem`, for a prefix) can never be passed from
/// an upstream: it frames the upstream's own connection, or the gateway writes it itself.
fn never_passed(stem: &str, prefix: bool) -> Option<&'static str> {
    const HOP: [&str; 8] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    const OWN: [&str; 5] = [
        "x-request-id",
        "x-upstream-request-id",
        "traceparent",
        "x-ratelimit-",
        "access-control-",
    ];
    // A prefix covers a name when the name starts with it; a name is covered by the
    // gateway's own prefixes (`x-ratelimit-`) when it starts with one.
    let hits = |fixed: &str| {
        fixed.starts_with(stem) && (prefix || fixed == stem)
            || (fixed.ends_with('-') && stem.starts_with(fixed))
    };
    if HOP.iter().any(|h| hits(h)) {
        return Some("it frames the upstream's own connection (hop-by-hop), not the reply");
    }
    if OWN.iter().any(|h| hits(h)) {
        return Some("the gateway writes it itself");
    }
    if hits("set-cookie") {
        return Some("an upstream's cookies would be set on the gateway's origin");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(names: &[&str]) -> Result<PassHeaders, String> {
        PassHeaders::parse(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn names_and_prefixes_are_matched_in_lower_case() {
        let p = parse(&["OpenAI-Processing-Ms", "x-mock-*"]).expect("valid");
        assert!(p.allows("openai-processing-ms"));
        assert!(p.allows("x-mock-model"));
        assert!(!p.allows("openai-organization"));
        assert!(!p.allows("x-moc"));
        assert!(parse(&[]).expect("valid").is_empty());
    }

    #[test]
    fn framing_the_gateways_own_and_cookies_are_refused() {
        for bad in [
            "transfer-encoding",
            "Connection",
            "x-request-id",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-*",
            "access-control-allow-origin",
            "set-cookie",
            "set-*",
            "*",
            "x-*",
            "tr*",
        ] {
            let e = parse(&[bad]).expect_err(bad);
            assert!(e.contains(bad), "{e}");
        }
        for bad in ["", "bad header", "a:b", "é"] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }
}
