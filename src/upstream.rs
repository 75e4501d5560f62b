//! Upstream stage: the peer for the chosen upstream (address, TLS + SNI, timeouts) and the
//! request as the upstream sees it: its Host and path prefix, the pool's credential in place
//! of the client's, and exact framing for the (possibly rewritten) body.

use pingora_core::connectors::http::Connector;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::RequestHeader;

use crate::route::{Pool, Upstream};

/// Headers that may carry the client's gateway credential or session; none goes upstream.
const CLIENT_CREDENTIALS: [&str; 7] = [
    "openai-organization",
    "openai-project",
    "authorization",
    "proxy-authorization",
    "api-key",
    "x-api-key",
    "cookie",
];

pub fn peer(pool: &Pool, up: &Upstream) -> Box<HttpPeer> {
    let sni = if up.cfg.tls {
        up.cfg.host.clone()
    } else {
        String::new()
    };
    let mut peer = HttpPeer::new(up.addr, up.cfg.tls, sni);
    let o = &mut peer.options;
    o.connection_timeout = Some(pool.cfg.connect_timeout);
    o.total_connection_timeout = Some(pool.cfg.connect_timeout * 2);
    o.read_timeout = Some(pool.cfg.read_timeout);
    o.write_timeout = Some(pool.cfg.read_timeout);
    // How long the connection may wait in the pool for the next request.
    o.idle_timeout = Some(pool.cfg.keepalive_timeout);
    Box::new(peer)
}

/// Gives a connection whose reply was read whole back to the pool, to wait there at most the
/// pool's `keepalive_timeout`; with a zero timeout it is closed now.
pub async fn release(connector: &Connector, client: HttpSession, peer: &HttpPeer) {
    match peer.options.idle_timeout {
        Some(idle) if idle.is_zero() => drop(client),
        idle => connector.release_http_session(client, peer, idle).await,
    }
}

/// Rewrites the client's request header into the upstream's.
pub fn rewrite_request(
    req: &mut RequestHeader,
    up: &Upstream,
    body_len: usize,
    request_id: &str,
) -> pingora_error::Result<()> {
    for h in CLIENT_CREDENTIALS {
        req.remove_header(h);
    }
    // Upstreams are spoken to in HTTP/1.1, whatever the client spoke (HTTP/2 on a TLS
    // listener): the request line must say so.
    req.set_version(http::Version::HTTP_11);
    if let Some((name, value)) = &up.authorization {
        req.insert_header(name.clone(), value.clone())?;
    }
    req.insert_header(http::header::HOST, up.host_header.clone())?;
    // The reply is metered as it passes, so ask for it uncompressed.
    req.remove_header("accept-encoding");
    req.insert_header("x-request-id", request_id)?;
    // The body was read whole (and maybe rewritten): send it with an exact length.
    req.remove_header(&http::header::TRANSFER_ENCODING);
    req.remove_header(&http::header::EXPECT);
    req.insert_header(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(body_len),
    )?;
    // Always origin-form (`/v1/...`): an absolute-form target from the client would name a
    // host of its choosing, which a front end might route the pool's credential to. An
    // origin-form target to an upstream without a base path is already what goes up.
    if up.cfg.base_path.is_empty() && req.uri.scheme().is_none() && req.uri.authority().is_none() {
        return Ok(());
    }
    let pq = req.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: http::Uri = format!("{}{}", up.cfg.base_path, pq).parse().map_err(|_| {
        pingora_error::Error::explain(pingora_error::ErrorType::InternalError, "bad upstream path")
    })?;
    req.set_uri(uri);
    Ok(())
}
