//! Who the client is, for the wrong-key and sign-in throttles: the connection's peer, or, when
//! that peer is a proxy the operator trusts (`[server] trusted_proxies`: a load balancer, a
//! CDN), the address it names in `X-Forwarded-For`. Behind a CDN every request comes from a
//! few of its addresses; counted by those, one client's wrong keys or passwords would lock
//! everyone behind the same CDN node out. A header from a peer that is not trusted is never
//! believed (anyone can send one).

use std::net::IpAddr;

use pingora_proxy::Session;

pub use crate::config::Cidr;

/// The client's address (see the module).
pub fn ip(session: &Session, trusted: &[Cidr]) -> Option<IpAddr> {
    let peer = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip().to_canonical())?;
    if trusted.is_empty() {
        return Some(peer);
    }
    // The last header line first: each proxy appends.
    let forwarded = session
        .req_header()
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .rev()
        .filter_map(|v| v.to_str().ok());
    Some(forwarded_client(peer, forwarded, trusted))
}

/// Walks back from the peer through `X-Forwarded-For` (each proxy appends the address it got
/// the request from), `lines` last first: the first address that is not a trusted proxy is the
/// client. An entry that is not an address stops the walk at the last trusted hop.
fn forwarded_client<'a>(
    peer: IpAddr,
    lines: impl Iterator<Item = &'a str>,
    trusted: &[Cidr],
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let mut client = peer;
    let hops = lines
        .flat_map(|line| line.rsplit(','))
        .map(str::trim)
        .filter(|hop| !hop.is_empty());
    for hop in hops {
        // An address, or one with its port (`203.0.113.5:5555`, `[2001:db8::1]:443`).
        let parsed = hop
            .parse::<IpAddr>()
            .or_else(|_| hop.parse::<std::net::SocketAddr>().map(|a| a.ip()));
        let Ok(ip) = parsed else {
            return client;
        };
        client = ip.to_canonical();
        if !is_trusted(client) {
            return client;
        }
    }
    client
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_hold_what_they_name() {
        let r = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(r.contains(ip("10.1.2.3")) && !r.contains(ip("11.0.0.1")));
        assert!(r.contains(ip("::ffff:10.9.9.9")), "IPv4-mapped");
        let one = Cidr::parse("192.0.2.7").unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:1::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(
            Cidr::parse("::ffff:10.0.0.0/104")
                .unwrap()
                .contains(ip("10.3.2.1"))
        );
        for bad in [
            "10.0.0.0/33",
            "nope",
            "10.0.0.0/x",
            "::/129",
            "0.0.0.0/0",
            "::/0",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_client_is_the_first_untrusted_hop_from_the_right() {
        let trusted = [Cidr::parse("10.0.0.0/8").unwrap()];
        let walk =
            |peer: &str, h: &[&str]| forwarded_client(ip(peer), h.iter().rev().copied(), &trusted);
        // Not from a trusted proxy: the header is not believed.
        assert_eq!(walk("203.0.113.9", &["198.51.100.1"]), ip("203.0.113.9"));
        assert_eq!(walk("10.0.0.2", &["198.51.100.1"]), ip("198.51.100.1"));
        // A client's own (forged) entries on the left are not reached.
        assert_eq!(
            walk("10.0.0.2", &["1.1.1.1, 198.51.100.1", "10.0.0.3"]),
            ip("198.51.100.1")
        );
        // No header, or one that is not an address: the last trusted hop.
        assert_eq!(walk("10.0.0.2", &[]), ip("10.0.0.2"));
        assert_eq!(walk("10.0.0.2", &["unknown"]), ip("10.0.0.2"));
        assert_eq!(walk("10.0.0.2", &["10.0.0.5"]), ip("10.0.0.5"));
        // With ports, and an empty entry at the end.
        assert_eq!(walk("10.0.0.2", &["203.0.113.5:5555, "]), ip("203.0.113.5"));
        assert_eq!(walk("10.0.0.2", &["[2001:db8::1]:443"]), ip("2001:db8::1"));
    }
}
