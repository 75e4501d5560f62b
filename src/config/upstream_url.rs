//! An upstream's base URL, read into its host, port, TLS and path prefix; a URL with a user and
//! password is refused without repeating them.

use super::UpstreamConfig;

/// An upstream URL with a `@` as its message shows it: whatever precedes its last `@` after
/// the scheme (a user and password, which may hold `/` or `?`) left out.
pub(super) fn shown_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    match rest.rfind('@') {
        Some(at) if scheme.is_empty() => format!("…@{}", &rest[at + 1..]),
        Some(at) => format!("{scheme}://…@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

pub(super) fn parse_upstream_url(url: &str) -> Result<UpstreamConfig, String> {
    // Said first, whatever else is wrong, so no message repeats a user and password.
    if url.contains('@') {
        return Err(format!(
            "'{}': an upstream URL carries no user or password: give the credential as \
             `api_key`",
            shown_url(url)
        ));
    }
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("'{url}' must start with http:// or https://"));
    };
    if rest.contains(['?', '#']) {
        return Err(format!(
            "'{url}': a base URL has no query or fragment (request paths are added to it)"
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if url.parse::<http::Uri>().is_err() || url.chars().any(|c| c.is_whitespace()) {
        return Err(format!(
            "'{}' is not a valid URL (a space or another character a URL cannot hold)",
            url.escape_debug()
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            let port = p
                .parse::<u16>()
                .map_err(|_| format!("'{url}' has a bad port"))?;
            (h, port)
        }
        _ => (authority, if tls { 443 } else { 80 }),
    };
    if host.is_empty() {
        return Err(format!("'{url}' has no host"));
    }
    let base_path = path.trim_end_matches('/');
    if base_path.ends_with("/v1") {
        return Err(format!("'{url}': give the base URL without /v1"));
    }
    Ok(UpstreamConfig {
        url: url.to_string(),
        tls,
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        base_path: base_path.to_string(),
        weight: 1,
        api_key: None,
        line: None,
    })
}
