//! Upstream stage: the peer for the chosen upstream (address, TLS + SNI, timeouts) and the
//! request as the upstream sees it: its Host and path prefix, the pool's credential in place
//! of the client's, and exact framing for the (possibly rewritten) body.

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
    o.idle_timeout = Some(std::time::Duration::from_secs(60));
    Box::new(peer)
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
    req.insert_header(http::header::CONTENT_LENGTH, body_len.to_string())?;
    // Always origin-form (`/v1/...`): an absolute-form target from the client would name a
    // host of its choosing, which a front end might route the pool's credential to.
    let pq = req.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: http::Uri = format!("{}{}", up.cfg.base_path, pq).parse().map_err(|_| {
        pingora_error::Error::explain(pingora_error::ErrorType::InternalError, "bad upstream path")
    })?;
    req.set_uri(uri);
    Ok(())
}
