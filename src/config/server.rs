//! `[server]`: its raw form as serde reads it, and its check.

use serde::Deserialize;
use toml::Spanned;

use super::raw::*;
use super::*;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

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
/// `[server]`: threads, timeouts, shutdown and upgrade, who may name the client.
#[derive(Debug, Clone)]
pub struct Server {
    pub threads: usize,
    pub grace_period_seconds: u64,
    /// After SIGTERM or SIGINT, how long the listeners stay open, draining (`/readyz` 503,
    /// replies closing their connections), before the shutdown proper.
    pub shutdown_delay: Duration,
    /// Where a process started with `--upgrade` takes the listening sockets over from this
    /// one (default `modelgate-upgrade.sock` beside the config file).
    pub upgrade_sock: PathBuf,
    /// Peers whose `X-Forwarded-For` names the client (see `crate::auth::client`).
    pub trusted_proxies: Vec<Cidr>,
    /// A request's header must be complete within this of its first byte, else the
    /// connection is closed.
    pub client_header_timeout: Duration,
    /// The whole request body must arrive within this, else 408.
    pub client_body_timeout: Duration,
    /// A reply write the client takes nothing of for this long ends the reply (a client that
    /// stopped reading holds no stream, upstream connection or export for good).
    pub client_send_timeout: Duration,
    /// An idle keep-alive connection is closed after this.
    pub keepalive_timeout: Duration,
    /// `on_client_gone = "finish"` (default): the upstream's reply to a client that left is
    /// read to its end (not sent) so its usage is billed; false: `"cancel"`.
    pub finish_when_gone: bool,
}

pub(super) fn check(raw: Option<&RawServer>, src: &Src<'_>, p: &mut Problems) -> Server {
    let ms = |v: Option<u64>, default: u64| Duration::from_millis(v.unwrap_or(default));
    let finish_when_gone = choose(
        raw.and_then(|s| s.on_client_gone.as_ref()),
        "server.on_client_gone",
        &[("finish", true), ("cancel", false)],
        src,
        p,
    );
    Server {
        threads: raw
            .and_then(|s| s.threads)
            .unwrap_or_else(default_threads)
            .max(1),
        grace_period_seconds: raw.and_then(|s| s.grace_period_seconds).unwrap_or(5),
        shutdown_delay: ms(raw.and_then(|s| s.shutdown_delay_ms), 0),
        upgrade_sock: src.dir.join(
            raw.and_then(|s| s.upgrade_sock.clone())
                .unwrap_or_else(|| "modelgate-upgrade.sock".into()),
        ),
        trusted_proxies: trusted_proxies(raw, src, p),
        client_header_timeout: ms(raw.and_then(|s| s.client_header_timeout_ms), 10_000),
        client_body_timeout: ms(raw.and_then(|s| s.client_body_timeout_ms), 60_000),
        client_send_timeout: ms(raw.and_then(|s| s.client_send_timeout_ms), 60_000)
            .max(Duration::from_millis(1)),
        keepalive_timeout: ms(raw.and_then(|s| s.keepalive_timeout_ms), 60_000),
        finish_when_gone,
    }
}

/// Both API listeners are one Pingora service with one runtime of `threads` threads: by
/// default one a core, whichever listener gets the traffic.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn trusted_proxies(server: Option<&RawServer>, src: &Src<'_>, p: &mut Problems) -> Vec<Cidr> {
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
