//! What of an upstream's reply header reaches clients: the fields that describe the content,
//! the provider's request id (renamed by the reply stage), and a pool's `pass_headers`. The
//! names are checked here (and the ones that can never pass refused); the upstream decoder
//! keeps only these (and the framing fields it reads) as it parses a reply.

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

    /// Whether a reply field named `name` (lower case) is kept for the client: by default,
    /// as the provider's request id, or named by the pool.
    pub fn keeps(&self, name: &str) -> bool {
        kept_by_default(name) || REQUEST_IDS.contains(&name) || self.allows(name)
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

/// Where providers put their own id of a request, most specific first: OpenAI's and most
/// OpenAI-compatible servers', Anthropic's, Bedrock's, Azure's.
pub const REQUEST_IDS: [&str; 5] = [
    "x-request-id",
    "request-id",
    "x-amzn-requestid",
    "apim-request-id",
    "x-ms-request-id",
];

/// An upstream reply field the client gets without the pool naming it: what describes the
/// content itself. (Hop-by-hop fields are dropped whatever names them.)
pub fn kept_by_default(name: &str) -> bool {
    matches!(
        name,
        "content-type"
            | "content-length"
            | "content-encoding"
            | "content-disposition"
            | "content-language"
            | "content-range"
            | "cache-control"
            | "etag"
            | "last-modified"
            | "retry-after"
            | "retry-after-ms"
    )
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
    if hits("set-cookie") || hits("set-cookie2") {
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
            "Set-Cookie2",
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
