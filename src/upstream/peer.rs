//! Upstream stage: one upstream as the gateway speaks to it, built once per config: the peer
//! connections go to (its address, followed when its host name moves; TLS and SNI; the pool's
//! timeouts), its `Host` header, the credential sent in place of the client's, its health.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use http::HeaderValue;
use pingora_core::upstreams::peer::HttpPeer;

use super::health::Health;
use crate::config::{AuthHeader, PoolConfig, Problem, Provider, Secret, UpstreamConfig};

pub struct Upstream {
    pub cfg: UpstreamConfig,
    /// Where connections go (its address, TLS and SNI, the pool's timeouts): the address
    /// resolved at load, and again every `DNS_REFRESH` when the URL names a host (see
    /// `resolve_again`). One for every try, not one a try.
    peer: arc_swap::ArcSwap<HttpPeer>,
    /// `Host` header value: host, plus the port when it is not the scheme's default.
    pub host_header: HeaderValue,
    /// The credential (the upstream's own key, else the pool's), sent in place of the
    /// client's: `Bearer <key>` in `Authorization`, or the key in `x-api-key`.
    pub authorization: Option<(http::HeaderName, HeaderValue)>,
    /// The API its pool speaks (what requests are translated to, and the headers it needs).
    pub provider: Provider,
    pub health: Arc<Health>,
}

/// How often an upstream named by a host name is looked up again: a provider that moves to
/// new addresses (hosted APIs behind a CDN do) is followed within this, without a restart.
pub const DNS_REFRESH: std::time::Duration = std::time::Duration::from_secs(30);

impl Upstream {
    /// The address a connection to it goes to now (always an internet address: the peer is
    /// made from one, `upstream::peer`).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.peer.load()._address.as_inet().copied()
    }

    /// The peer a connection to it is made to now.
    pub fn peer(&self) -> Arc<HttpPeer> {
        self.peer.load_full()
    }

    /// Whether its URL names a host (not an address) that may move.
    pub fn named(&self) -> bool {
        self.cfg.host.parse::<std::net::IpAddr>().is_err()
    }

    /// Looks its host up again with `resolve` (blocking); the address in use stays while the
    /// host still has it (no hopping between a name's addresses), else the first one is taken.
    /// Returns the old and new address when it moved.
    pub fn resolve_again(
        &self,
        resolve: impl Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
    ) -> Option<(SocketAddr, SocketAddr)> {
        let found = resolve(&self.cfg.host, self.cfg.port).ok()?;
        let now = self.addr()?;
        if found.contains(&now) {
            return None;
        }
        let new = *found.first()?;
        let mut peer = HttpPeer::clone(&self.peer.load());
        peer._address = pingora_core::protocols::l4::socket::SocketAddr::Inet(new);
        self.peer.store(Arc::new(peer));
        Some((now, new))
    }

    /// The upstream `u` of pool `p`, with `health` (carried over from the router in force for
    /// an upstream a reload keeps); the problem with its URL or credential if it cannot be made.
    pub fn build(
        p: &PoolConfig,
        u: &UpstreamConfig,
        health: Arc<Health>,
        file: &str,
    ) -> Result<Upstream, Problem> {
        let at = |field: &str, why: String| Problem::new(file, u.line, field, why);
        let addr = match (u.host.as_str(), u.port)
            .to_socket_addrs()
            .map(|mut a| a.next())
        {
            Ok(Some(addr)) => addr,
            _ => {
                return Err(at(
                    &format!("pools.{}.upstreams", p.name),
                    format!("cannot resolve '{}'", u.url),
                ));
            }
        };
        let default_port = if u.tls { 443 } else { 80 };
        let host = if u.port == default_port {
            u.host.clone()
        } else if u.host.contains(':') {
            format!("[{}]:{}", u.host, u.port)
        } else {
            format!("{}:{}", u.host, u.port)
        };
        let key = u.api_key.as_ref().or(p.api_key.as_ref());
        let authorization = key.and_then(|k| credential(k, p.auth_header));
        if key.is_some() && authorization.is_none() {
            return Err(at(
                &format!("pools.{}.api_key", p.name),
                "not a valid header value".into(),
            ));
        }
        let host_header = HeaderValue::from_str(&host).map_err(|_| {
            at(
                &format!("pools.{}.upstreams", p.name),
                format!("bad host in '{}'", u.url),
            )
        })?;
        Ok(Upstream {
            cfg: u.clone(),
            peer: arc_swap::ArcSwap::from_pointee(peer(p, u, addr)),
            host_header,
            authorization,
            provider: p.provider,
            health,
        })
    }
}

/// The addresses of `host` (the system's resolver, blocking).
pub fn lookup(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok((host, port).to_socket_addrs()?.collect())
}

/// The peer connections to an upstream are made to, with its pool's timeouts: made when the
/// router is built (and again when its address moves), shared by every try.
pub fn peer(pool: &PoolConfig, up: &UpstreamConfig, addr: SocketAddr) -> HttpPeer {
    let sni = if up.tls {
        up.host.clone()
    } else {
        String::new()
    };
    let mut peer = HttpPeer::new(addr, up.tls, sni);
    let o = &mut peer.options;
    o.connection_timeout = Some(pool.connect_timeout);
    o.total_connection_timeout = Some(pool.connect_timeout * 2);
    o.read_timeout = Some(pool.read_timeout);
    o.write_timeout = Some(pool.read_timeout);
    // How long the connection may wait in the pool for the next request.
    o.idle_timeout = Some(pool.keepalive_timeout);
    peer
}

/// The credential header for `key`, its value marked never to be logged.
fn credential(key: &Secret, header: AuthHeader) -> Option<(http::HeaderName, HeaderValue)> {
    let (name, value) = match header {
        AuthHeader::Authorization => (
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {}", key.expose())),
        ),
        AuthHeader::XApiKey => (
            http::HeaderName::from_static("x-api-key"),
            HeaderValue::from_str(key.expose()),
        ),
    };
    let mut value = value.ok()?;
    value.set_sensitive(true);
    Some((name, value))
}
