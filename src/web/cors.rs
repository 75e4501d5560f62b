//! CORS for the `/v1` API on both listeners, so browser apps can call the gateway directly:
//! preflights (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) are answered by the
//! gateway before auth, and every reply to an allowed origin, the gateway's own and the
//! upstream's alike, carries `Access-Control-Allow-Origin` and the headers a client reads.
//! Off unless `[cors] allow_origins` is set. The console and pages never get CORS headers.

use http::HeaderValue;
use pingora_http::ResponseHeader;

/// Response headers a browser client may read.
const EXPOSE: &str = "x-request-id, retry-after, x-ratelimit-limit-requests, \
     x-ratelimit-remaining-requests, x-ratelimit-reset-requests, x-ratelimit-limit-tokens, \
     x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens, x-ratelimit-limit-concurrency, \
     x-ratelimit-remaining-concurrency, content-disposition, x-upstream-request-id";

#[derive(Debug, Clone)]
pub struct Cors {
    /// Lowercased origins (`scheme://host[:port]`); empty with `any`.
    origins: Vec<String>,
    any: bool,
    methods: HeaderValue,
    /// None: allow the headers the preflight asks for.
    headers: Option<HeaderValue>,
    max_age: HeaderValue,
}

impl Cors {
    /// From `[cors]`; an error names what is wrong.
    pub fn new(
        origins: &[String],
        methods: Option<&[String]>,
        headers: Option<&[String]>,
        max_age_seconds: u64,
    ) -> Result<Cors, String> {
        let any = origins.iter().any(|o| o == "*");
        for o in origins.iter().filter(|o| *o != "*") {
            let ok = (o.starts_with("http://") || o.starts_with("https://"))
                && !o
                    .trim_end_matches('/')
                    .contains(|c: char| c.is_whitespace())
                && o.split("://")
                    .nth(1)
                    .is_some_and(|h| !h.is_empty() && !h.contains('/'));
            if !ok {
                return Err(format!(
                    "'{o}' is not an origin like https://app.example.com"
                ));
            }
        }
        let join = |v: &[String]| HeaderValue::from_str(&v.join(", ")).map_err(|e| e.to_string());
        let default_methods = ["GET", "POST", "OPTIONS"].map(String::from);
        Ok(Cors {
            origins: origins.iter().map(|o| o.to_ascii_lowercase()).collect(),
            any,
            methods: join(methods.unwrap_or(&default_methods))?,
            headers: headers.map(join).transpose()?,
            max_age: HeaderValue::from(max_age_seconds),
        })
    }

    /// The `Access-Control-Allow-Origin` value for this `Origin`, if it is allowed.
    pub fn allow(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let origin = origin?;
        if self.any {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin.to_str().ok()?.to_ascii_lowercase();
        self.origins.contains(&o).then(|| origin.clone())
    }

    /// The headers of a preflight's answer for an allowed origin.
    pub fn preflight(
        &self,
        resp: &mut ResponseHeader,
        allow: &HeaderValue,
        requested_headers: Option<&HeaderValue>,
    ) -> pingora_error::Result<()> {
        decorate(resp, Some(allow))?;
        resp.insert_header("access-control-allow-methods", self.methods.clone())?;
        if let Some(h) = self.headers.clone().or_else(|| requested_headers.cloned()) {
            resp.insert_header("access-control-allow-headers", h)?;
        }
        resp.insert_header("access-control-max-age", self.max_age.clone())
    }
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
