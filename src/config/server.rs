//! `[server]`: its raw form as serde reads it, and its check.

use serde::Deserialize;
use toml::Spanned;

use super::raw::*;
use super::*;
use std::net::IpAddr;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) threads: Option<usize>,
    pub(super) trusted_proxies: Option<Spanned<Vec<String>>>,
    #[serde(default, deserialize_with = "duration_s")]
    pub(super) grace_period_seconds: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) shutdown_delay_ms: Option<u64>,
    pub(super) upgrade_sock: Option<String>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) client_header_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) client_body_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) client_send_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "duration_ms")]
    pub(super) keepalive_timeout_ms: Option<u64>,
    pub(super) on_client_gone: Option<Spanned<String>>,
}

/// `[server] trusted_proxies`: the proxies whose `X-Forwarded-For` names the client.
pub(super) fn trusted_proxies(
    server: Option<&RawServer>,
    src: &Src<'_>,
    p: &mut Problems,
) -> Vec<Cidr> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    server
        .as_ref()
        .and_then(|s| s.trusted_proxies.as_ref())
        .map(|list| {
            list.get_ref()
                .iter()
                .filter_map(|v| match Cidr::parse(v) {
                    Ok(c) => Some(c),
                    Err(m) => {
                        p.push(Problem::new(
                            file,
                            at(list.span()),
                            "server.trusted_proxies",
                            m,
                        ));
                        None
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// An address range: `10.0.0.0/8`, `2001:db8::/32`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    /// An address or a range; not one holding every address (`0.0.0.0/0`, `::/0`), which
    /// would make `X-Forwarded-For` the client's own to write.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not an address or a range like 10.0.0.0/8"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("'{s}': the prefix length must be 0 to {max}"))?,
        };
        if bits == 0 {
            return Err(format!(
                "'{s}' trusts every address: X-Forwarded-For would be the client's to write"
            ));
        }
        Ok(Cidr {
            net: net.to_canonical(),
            bits: if net.is_ipv6() && net.to_canonical().is_ipv4() {
                bits.saturating_sub(96)
            } else {
                bits
            },
        })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(
                u128::from(u32::from(n)),
                u128::from(u32::from(a)),
                self.bits,
                32,
            ),
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                prefix_eq(u128::from(n), u128::from(a), self.bits, 128)
            }
            _ => false,
        }
    }
}

/// Whether the top `bits` of two `width`-bit numbers are the same.
fn prefix_eq(a: u128, b: u128, bits: u8, width: u32) -> bool {
    let shift = width - u32::from(bits);
    shift >= width || (a >> shift) == (b >> shift)
}
