//! `[server]`: its raw form as serde reads it, and its check.

use serde::Deserialize;
use toml::Spanned;

use super::raw::*;
use super::*;

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
) -> Vec<crate::auth::client::Cidr> {
    let file = src.file;
    let at = |s: std::ops::Range<usize>| src.at(s);
    server
        .as_ref()
        .and_then(|s| s.trusted_proxies.as_ref())
        .map(|list| {
            list.get_ref()
                .iter()
                .filter_map(|v| match crate::auth::client::Cidr::parse(v) {
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
