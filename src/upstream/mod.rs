//! Upstream stage: the peer for the chosen upstream (address, TLS + SNI, timeouts) and the
//! request as the upstream sees it: its Host and path prefix, the pool's credential in place
//! of the client's, and exact framing for the (possibly rewritten) body.

use pingora_http::RequestHeader;

pub mod health;
mod peer;
mod pool;
pub use crate::http1::client::Request;
pub use peer::{DNS_REFRESH, Upstream, lookup, peer};
pub use pool::{Conn, Connections, check_trust_store, warm_tls};

/// Whether a request header stays with the client: what may carry its gateway credential or
/// session; what says who and where the client is (a client could write any address there, and
/// a hosted model's provider has no business with the end user's address); and the hop-by-hop
/// headers (RFC 9110 §7.6.1), which are about the client's connection to the gateway, not the
/// request (the upstream connection is the gateway's own, kept alive in the pool: a client's
/// `Connection: close` must not close it).
fn stays_with_client(name: &str) -> Option<&'static str> {
    Some(match name {
        "openai-organization" => "openai-organization",
        "openai-project" => "openai-project",
        "authorization" => "authorization",
        "proxy-authorization" => "proxy-authorization",
        "api-key" => "api-key",
        "x-api-key" => "x-api-key",
        "cookie" => "cookie",
        "forwarded" => "forwarded",
        "x-forwarded-for" => "x-forwarded-for",
        "x-forwarded-host" => "x-forwarded-host",
        "x-forwarded-proto" => "x-forwarded-proto",
        "x-forwarded-port" => "x-forwarded-port",
        "x-real-ip" => "x-real-ip",
        "connection" => "connection",
        "keep-alive" => "keep-alive",
        "proxy-connection" => "proxy-connection",
        "te" => "te",
        "trailer" => "trailer",
        "upgrade" => "upgrade",
        _ => return None,
    })
}

/// A message's hop-by-hop headers (RFC 9110 §7.6.1), for the request and the reply alike: those
/// `pick` gives a static name for, found in one pass over the header (`keys()` gives each name
/// once), and those its `Connection` names. Nothing is allocated unless `Connection` names more
/// than keep-alive or close.
pub struct HopHeaders {
    fixed: [&'static str; 24],
    n: usize,
    named: Vec<String>,
}

impl HopHeaders {
    pub fn of(headers: &http::HeaderMap, pick: fn(&str) -> Option<&'static str>) -> HopHeaders {
        let mut fixed = [""; 24];
        let mut n = 0;
        for name in headers.keys().filter_map(|k| pick(k.as_str())) {
            if n < fixed.len() {
                fixed[n] = name;
                n += 1;
            }
        }
        let options_only = headers.get_all(http::header::CONNECTION).iter().all(|v| {
            let v = v.as_bytes().trim_ascii();
            v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"close")
        });
        let named = if options_only {
            Vec::new()
        } else {
            connection_named(headers)
        };
        HopHeaders { fixed, n, named }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.fixed[..self.n]
            .iter()
            .copied()
            .chain(self.named.iter().map(String::as_str))
    }
}

/// The headers a message's `Connection` names, lower case.
fn connection_named(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split(',')
                .map(|n| n.trim().to_ascii_lowercase())
                .filter(|n| !n.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The Messages API version an Anthropic upstream is asked for when the client names none
/// (a request translated from another API, a health check): the one the translation writes.
pub const ANTHROPIC_VERSION: &str = "2026-10-21";

/// Rewrites the client's request header into the upstream's. `path`: where a translated
/// request goes instead of the client's path (its query is not kept).
pub fn rewrite_request(
    req: &mut RequestHeader,
    up: &Upstream,
    body_len: usize,
    request_id: &str,
    path: Option<&str>,
) -> pingora_error::Result<()> {
    // What stays with the client, and the headers its `Connection` names (removed before the
    // gateway's own go in, so none of those can be named away).
    let hop = HopHeaders::of(&req.headers, stays_with_client);
    for name in hop.names() {
        req.remove_header(name);
    }
    // Upstreams are spoken to in HTTP/1.1, whatever the client spoke (HTTP/2 on a TLS
    // listener): the request line must say so.
    req.set_version(http::Version::HTTP_11);
    if let Some((name, value)) = &up.authorization {
        req.insert_header(name.clone(), value.clone())?;
    }
    req.insert_header(http::header::HOST, up.host_header.clone())?;
    // The reply is metered as it passes, so ask for it uncompressed: in so many words (a
    // request without `Accept-Encoding` accepts any coding, RFC 9110 §12.5.3, and a gzipped
    // reply's usage cannot be read).
    req.insert_header(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    )?;
    req.insert_header("x-request-id", request_id)?;
    if up.provider == crate::config::Provider::Anthropic
        && !req.headers.contains_key("anthropic-version")
    {
        req.insert_header(
            "anthropic-version",
            http::HeaderValue::from_static(ANTHROPIC_VERSION),
        )?;
    }
    // The body was read whole (and maybe rewritten): send it with an exact length.
    req.remove_header(&http::header::TRANSFER_ENCODING);
    req.remove_header(&http::header::EXPECT);
    req.insert_header(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(body_len),
    )?;
    // Always origin-form (`/v1/...`): an absolute-form target from the client would name a
    // host of its choosing, which a front end might route the pool's credential to. An
    // origin-form target to an upstream without a base path is already what goes up. A path
    // the gateway read without its trailing slash goes up as the API names it (a server that
    // redirects `/v1/chat/completions/` would tell the client its own address).
    // (Pingora keeps an absolute-form target's bytes for the wire, whatever its URI says: only
    // a target that starts with `/` is origin-form.)
    if let Some(path) = path {
        let uri: http::Uri = format!("{}{path}", up.cfg.base_path).parse().map_err(|_| {
            pingora_error::Error::explain(
                pingora_error::ErrorType::InternalError,
                "bad upstream path",
            )
        })?;
        req.set_uri(uri);
        return Ok(());
    }
    let path = req.uri.path();
    let trailing = path.len() > 1 && path.ends_with('/');
    if up.cfg.base_path.is_empty()
        && !trailing
        && req.raw_path().starts_with(b"/")
        && req.uri.scheme().is_none()
        && req.uri.authority().is_none()
    {
        return Ok(());
    }
    let path = if trailing {
        &path[..path.len() - 1]
    } else {
        path
    };
    let query = req.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let uri: http::Uri = format!("{}{path}{query}", up.cfg.base_path)
        .parse()
        .map_err(|_| {
            pingora_error::Error::explain(
                pingora_error::ErrorType::InternalError,
                "bad upstream path",
            )
        })?;
    req.set_uri(uri);
    Ok(())
}
