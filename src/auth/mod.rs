//! Auth stage: read the bearer key from `Authorization` (or, for Anthropic's clients, the bare
//! key from `x-api-key`; never from a URL), look it up by its
//! SHA-256 in the live key table, confirm in constant time, and refuse dead keys. The secret
//! itself is never stored, logged or forwarded.

pub mod client;
pub mod throttle;

use std::sync::Arc;

use subtle::ConstantTimeEq;

use crate::config::keys::{Key, KeyTable, sha256};
use crate::error::GatewayError;

pub use throttle::Throttle;

/// A query component's decoding: `+` is a space and `%XX` a byte; an escape that is not one
/// stays as it is.
pub fn decode_query(s: &str) -> String {
    if !s.contains(['%', '+']) {
        return s.to_string();
    }
    let spaced = s.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8_lossy()
        .into_owned()
}

/// The bearer token of an `Authorization` header value, if it is one.
pub fn bearer(header: Option<&[u8]>) -> Option<&[u8]> {
    let h = header?;
    let (scheme, rest) = h.split_at(h.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Query parameters that would carry a key, as `key_param` spells them (decoded, lower case,
/// without `-` and `_`: `api_key`, `api-key`, `apiKey`, `api%5Fkey`, `x-api-key`…). Such a URL
/// is refused outright: a key in a URL ends up in logs and histories.
const KEY_PARAMS: [&str; 6] = [
    "apikey",
    "xapikey",
    "key",
    "token",
    "accesstoken",
    "authorization",
];

fn key_param(name: &str) -> bool {
    let name: String = decode_query(name)
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    KEY_PARAMS.contains(&name.as_str())
}

/// Whether a query string carries a key: under a name keys go by, or anywhere in it when it
/// holds a key of `table` (it must not go upstream or into a log either way).
pub fn key_in_query(query: Option<&str>, table: &KeyTable) -> bool {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return false;
    };
    query.split('&').any(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        key_param(name) || (!value.is_empty() && is_key(table, &decode_query(value)))
    }) || mentions_secret(table, query)
}

/// Whether `text` is exactly the secret of a key in `table`.
fn is_key(table: &KeyTable, text: &str) -> bool {
    table.get_by_hash(&sha256(text.as_bytes())).is_some()
}

/// The fewest characters a secret is looked for in (shorter words are not hashed).
const SECRET_MIN: usize = 8;
/// The most words of a text hashed to look for a secret: a long URL costs no more.
const WORDS_MAX: usize = 64;

/// Whether `text` holds the secret of a key in `table` (a key pasted where it does not belong,
/// maybe as `Bearer sk-…`, quoted, or percent-encoded once or twice): a reply must not repeat
/// it, and it must go nowhere. Its words (split at whatever cannot be part of a key) are
/// looked up by hash, as a presented key is.
pub fn mentions_secret(table: &KeyTable, text: &str) -> bool {
    let mut decoded = std::borrow::Cow::Borrowed(text);
    // Twice at most: `%2573k-…` is `%73k-…` is `sk-…`.
    for _ in 0..3 {
        let words = decoded
            .split(|c: char| {
                !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '%'))
            })
            .filter(|w| w.len() >= SECRET_MIN)
            .take(WORDS_MAX);
        if words.into_iter().any(|w| is_key(table, w)) {
            return true;
        }
        if !decoded.contains(['%', '+']) {
            return false;
        }
        decoded = std::borrow::Cow::Owned(decode_query(&decoded));
    }
    false
}

/// Whether `text` is, or holds, the secret of a key in `table`.
pub fn is_secret(table: &KeyTable, text: &str) -> bool {
    is_key(table, text) || mentions_secret(table, text)
}

/// The token a request presents: `Authorization: Bearer`, or, where Anthropic's clients may
/// call (`x_api_key`), the bare key in `x-api-key` when there is no `Authorization`. Two of
/// either header are refused: which one counts would be a guess (a proxy before the gateway
/// may read the other).
pub fn presented(
    headers: &http::HeaderMap,
    x_api_key: bool,
) -> Result<Option<&[u8]>, GatewayError> {
    // `x-api-key` only where it is read.
    let read: &[&str] = if x_api_key {
        &["authorization", "x-api-key"]
    } else {
        &["authorization"]
    };
    for &name in read {
        if headers.get_all(name).iter().nth(1).is_some() {
            return Err(GatewayError::InvalidParameter {
                param: "authorization",
                message: format!("The request has more than one '{name}' header: send one."),
            });
        }
    }
    // Both, naming different keys: which one counts would be a guess too.
    if x_api_key {
        let api_key = headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii());
        let bearer = bearer(
            headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
        );
        if let (Some(a), Some(b)) = (api_key, bearer) {
            if a != b {
                return Err(GatewayError::InvalidParameter {
                    param: "authorization",
                    message: "The request names two different keys ('Authorization' and \
                              'x-api-key'): send one."
                        .into(),
                });
            }
        }
    }
    Ok(presented_one(headers, x_api_key))
}

fn presented_one(headers: &http::HeaderMap, x_api_key: bool) -> Option<&[u8]> {
    match headers.get(http::header::AUTHORIZATION) {
        Some(v) => bearer(Some(v.as_bytes())),
        None if x_api_key => headers
            .get("x-api-key")
            .map(|v| v.as_bytes().trim_ascii())
            .filter(|t| !t.is_empty()),
        None => None,
    }
}

/// The key for `token`, guarded against guessing: an address that presented too many wrong
/// keys is refused (429) for any key it has not used before (a right guess looks like a wrong
/// one), and each wrong key counts against it and in the metrics. A key that address used last
/// goes on working, so one client with a wrong key does not lock out the others behind the
/// same address. No token at all is a client not set up yet, not a guess: 401 only.
pub fn authenticate_guarded(
    table: &KeyTable,
    throttle: &crate::auth::Throttle,
    client: Option<std::net::IpAddr>,
    token: Option<&[u8]>,
    now_unix: i64,
    metrics: &crate::ops::metrics::Metrics,
) -> Result<Arc<Key>, GatewayError> {
    use std::sync::atomic::Ordering::Relaxed;
    let now = std::time::Instant::now();
    let client_id = client.map(crate::auth::throttle::client_id);
    let throttled = client.and_then(|ip| throttle.check(ip, now).err());
    let found = authenticate_token(table, token, now_unix);
    if let Some((wait, hard)) = throttled {
        let known = found
            .as_ref()
            .is_ok_and(|k| client_id == Some(k.last_client.load(Relaxed)));
        if hard || !known {
            // A wrong key counts on while throttled, up to the hard limit.
            if let (Err(_), Some(ip), Some(_)) = (&found, client, token) {
                throttle.fail(ip, now);
            }
            return Err(GatewayError::RateLimited {
                message: "Too many wrong keys from this address; try again later.".into(),
                retry_after: crate::limit::rate::retry_after_secs(wait),
                reason: "auth_failures",
            });
        }
    }
    if let (Ok(key), Some(id)) = (&found, client_id) {
        // A store only when the client changes (no shared cache line written per request).
        if key.last_client.load(Relaxed) != id {
            key.last_client.store(id, Relaxed);
        }
    }
    if found.is_err() && token.is_some() {
        if let Some(ip) = client {
            throttle.fail(ip, now);
        }
        metrics.auth_failure(client);
    }
    found
}

/// The key for a request, or 401 `invalid_api_key`.
pub fn authenticate(
    table: &KeyTable,
    authorization: Option<&[u8]>,
    now_unix: i64,
) -> Result<Arc<Key>, GatewayError> {
    authenticate_token(table, bearer(authorization), now_unix)
}

/// The key for a bare token (an `x-api-key` value), or 401 `invalid_api_key`.
pub fn authenticate_token(
    table: &KeyTable,
    token: Option<&[u8]>,
    now_unix: i64,
) -> Result<Arc<Key>, GatewayError> {
    let token = token
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
        .ok_or(GatewayError::InvalidApiKey)?;
    let digest = sha256(token);
    let key = table
        .get_by_hash(&digest)
        .ok_or(GatewayError::InvalidApiKey)?;
    // The map lookup found a candidate; confirm with a comparison whose time does not depend
    // on where the digests differ.
    if !bool::from(key.sha256.ct_eq(&digest)) || !key.is_live(now_unix) {
        return Err(GatewayError::InvalidApiKey);
    }
    Ok(key.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> KeyTable {
        KeyTable::parse(
            "k.toml",
            r#"
[[keys]]
id = "live"
secret = "sk-live-123456"
[[keys]]
id = "off"
secret = "sk-off-1234567"
disabled = true
[[keys]]
id = "old"
secret = "sk-old-1234567"
expires_at = "2020-01-01T00:00:00Z"
"#,
        )
        .expect("keys")
    }

    #[test]
    fn bearer_parsing_is_strict_about_the_scheme() {
        assert_eq!(bearer(Some(b"Bearer sk-1")), Some(&b"sk-1"[..]));
        assert_eq!(bearer(Some(b"bearer   sk-1 ")), Some(&b"sk-1"[..]));
        assert_eq!(bearer(Some(b"Basic abc")), None);
        assert_eq!(bearer(Some(b"Bearer ")), None);
        assert_eq!(bearer(Some(b"Bearer")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn only_live_known_keys_pass() {
        let t = table();
        let now = 1_800_000_000;
        assert_eq!(
            authenticate(&t, Some(b"Bearer sk-live-123456"), now)
                .expect("live")
                .id,
            "live"
        );
        for h in [
            &b"Bearer sk-off-1234567"[..],
            b"Bearer sk-old-1234567",
            b"Bearer sk-nope",
            b"sk-live-123456",
        ] {
            assert_eq!(
                authenticate(&t, Some(h), now).err(),
                Some(GatewayError::InvalidApiKey)
            );
        }
        assert_eq!(
            authenticate(&t, None, now).err(),
            Some(GatewayError::InvalidApiKey)
        );
    }
}
