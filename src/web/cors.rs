//! CORS for the `/v1` API on both listeners, so browser apps can call the gateway directly:
//! preflights (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) are answered by the
//! gateway before auth, and every reply to an allowed origin, the gateway's own and the
//! upstream's alike, carries `Access-Control-Allow-Origin` and the headers a client reads.
//! Off unless `[cors] allow_origins` is set. The console and pages never get CORS headers.

use http::HeaderValue;
use pingora_http::ResponseHeader;

pub use crate::config::Cors;

/// Response headers a browser client may read.
const EXPOSE: &str = "x-request-id, retry-after, x-ratelimit-limit-requests, \
     x-ratelimit-remaining-requests, x-ratelimit-reset-requests, x-ratelimit-limit-tokens, \
     x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens, x-ratelimit-limit-concurrency, \
     x-ratelimit-remaining-concurrency, content-disposition, x-upstream-request-id";

/// The headers of a preflight's answer for an allowed origin.
pub fn preflight(
    cors: &Cors,
    resp: &mut ResponseHeader,
    allow: &HeaderValue,
    requested_headers: Option<&HeaderValue>,
) -> pingora_error::Result<()> {
    decorate(resp, Some(allow))?;
    resp.insert_header("access-control-allow-methods", cors.methods.clone())?;
    if let Some(h) = cors.headers.clone().or_else(|| requested_headers.cloned()) {
        resp.insert_header("access-control-allow-headers", h)?;
    }
    resp.insert_header("access-control-max-age", cors.max_age.clone())
}

/// Adds the CORS headers of an allowed origin to a reply (nothing for `None`).
pub fn decorate(
    resp: &mut ResponseHeader,
    allow: Option<&HeaderValue>,
) -> pingora_error::Result<()> {
    let Some(allow) = allow else { return Ok(()) };
    resp.insert_header("access-control-allow-origin", allow.clone())?;
    resp.insert_header("access-control-expose-headers", EXPOSE)?;
    resp.append_header("vary", "Origin")?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn origins_match_exactly_and_star_allows_any() {
        let c = Cors::new(&["https://App.example".into()], None, None, 600).unwrap();
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(
            c.allow(Some(&v("https://app.example"))),
            Some(v("https://app.example"))
        );
        assert_eq!(c.allow(Some(&v("https://app.example.evil"))), None);
        assert_eq!(c.allow(Some(&v("http://app.example"))), None);
        assert_eq!(c.allow(None), None);
        let any = Cors::new(&["*".into()], None, None, 0).unwrap();
        assert_eq!(any.allow(Some(&v("https://x.y"))), Some(v("*")));
        assert!(Cors::new(&["app.example".into()], None, None, 0).is_err());
        assert!(Cors::new(&["https://a.b/path".into()], None, None, 0).is_err());
    }
}
