//! The one place that decides how a refusal or failure looks to the client: every error the
//! gateway makes is a `GatewayError`, and `GatewayError::parts` maps it to status, `type`,
//! `code` and `param` in one exhaustive match. `body` writes the OpenAI-shaped JSON;
//! `body_in` the shape of the API the request speaks (Anthropic's on `/v1/messages`).

use serde_json::json;

/// The most request headers, and header bytes (names and values), a request may bring: more
/// would go upstream, and a model server that drops the connection on them (uvicorn's h11
/// does) would look down, and be ejected, for one client's request.
pub const MAX_HEADERS: usize = 100;
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayError {
    InvalidJson(String),
    MissingParameter(&'static str),
    InvalidParameter {
        param: &'static str,
        message: String,
    },
    /// A parameter (or an endpoint, `param = "model"`) the model's provider has no
    /// equivalent of, in a request the gateway translates for it.
    Unsupported {
        param: &'static str,
        message: String,
    },
    InvalidApiKey,
    InsufficientBalance,
    PermissionDenied {
        param: &'static str,
        message: String,
    },
    ModelNotFound(String),
    NotFound(String),
    /// `/v1/responses/{id}`: no response by that id was made through the gateway with this key.
    ResponseNotFound(String),
    /// Console: wrong user or password.
    BadCredentials,
    /// Console: no live session. `change`: the call would change something, which the
    /// contract refuses with 403 (like a cross-site change), not 401.
    NotSignedIn {
        change: bool,
    },
    /// Console: a state-changing call without a same-origin `Origin` or the page's CSRF token.
    CrossSite,
    /// Console: the thing to create exists already (a key id).
    Conflict(String),
    RequestTooLarge(usize),
    /// More headers, or more header bytes, than go upstream: (headers, bytes) sent.
    HeadersTooLarge(usize, usize),
    /// The upstream's own error reply, whose body was empty or not JSON: its status, kept.
    UpstreamReply(u16, String),
    /// A CORS preflight from an origin `[cors] allow_origins` does not list.
    OriginNotAllowed,
    /// A known path with a method it does not take; `Allow` lists the one it does.
    MethodNotAllowed(&'static str),
    /// The client did not send its whole body within `client_body_timeout_ms`.
    RequestTimeout(u64),
    /// `retry_after`: whole seconds until a request would be admitted (the Retry-After header).
    /// `reason`: which limit (`rpm`, `tpm`, `concurrency`, `auth_failures`, `sign_ins`).
    RateLimited {
        message: String,
        retry_after: u64,
        reason: &'static str,
    },
    UpstreamError(String),
    NoHealthyUpstream(String),
    /// `[limits] on_redis_down = "deny"` and the shared limits cannot be counted now.
    LimiterUnavailable,
    /// The usage store is full (`[storage] on_store_full = "refuse"`): a new request would
    /// leave a record that nothing can store.
    StoreUnavailable,
    UpstreamTimeout(String),
    /// The gateway is shutting down and ended the request.
    ShuttingDown,
    Internal(String),
}

/// Status and the fields of the OpenAI error object.
pub struct ErrorParts {
    pub status: u16,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<&'static str>,
    pub message: String,
}

impl GatewayError {
    // A table: one arm a variant, exhaustive.
    #[allow(clippy::too_many_lines)]
    pub fn parts(&self) -> ErrorParts {
        use GatewayError as E;
        let (status, kind, code, param, message) = match self {
            E::InvalidJson(m) => (
                400,
                "invalid_request_error",
                "invalid_json",
                None,
                format!("The request body is not valid JSON: {m}"),
            ),
            E::MissingParameter(p) => (
                400,
                "invalid_request_error",
                "missing_required_parameter",
                Some(*p),
                format!("Missing required parameter: '{p}'."),
            ),
            E::InvalidParameter { param, message } => (
                400,
                "invalid_request_error",
                "invalid_parameter",
                Some(*param),
                message.clone(),
            ),
            E::Unsupported { param, message } => (
                400,
                "invalid_request_error",
                "unsupported_parameter",
                Some(*param),
                message.clone(),
            ),
            E::InvalidApiKey => (
                401,
                "invalid_request_error",
                "invalid_api_key",
                None,
                "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.".into(),
            ),
            E::InsufficientBalance => (
                402,
                "insufficient_quota",
                "insufficient_balance",
                None,
                "This key has spent its budget.".into(),
            ),
            E::PermissionDenied { param, message } => (
                403,
                "permission_error",
                "permission_denied",
                Some(*param),
                message.clone(),
            ),
            E::ModelNotFound(m) => (
                404,
                "invalid_request_error",
                "model_not_found",
                Some("model"),
                format!("The model '{m}' does not exist or you do not have access to it."),
            ),
            E::NotFound(path) => (
                404,
                "invalid_request_error",
                "not_found",
                None,
                format!("Unknown path: {path}"),
            ),
            E::ResponseNotFound(id) => (
                404,
                "invalid_request_error",
                "response_not_found",
                Some("response_id"),
                format!(
                    "No response '{id}' was made through this gateway with this key (or it has \
                     been forgotten since)."
                ),
            ),
            E::BadCredentials => (
                401,
                "invalid_request_error",
                "invalid_credentials",
                None,
                "Wrong user or password.".into(),
            ),
            E::NotSignedIn { change: false } => (
                401,
                "invalid_request_error",
                "not_signed_in",
                None,
                "Sign in to the console first.".into(),
            ),
            E::NotSignedIn { change: true } => (
                403,
                "permission_error",
                "not_signed_in",
                None,
                "A change needs a signed-in console session (its cookie): sign in first.".into(),
            ),
            E::CrossSite => (
                403,
                "permission_error",
                "csrf_rejected",
                None,
                "This change must come from the console page itself (same-origin Origin or its CSRF token).".into(),
            ),
            E::Conflict(m) => (409, "invalid_request_error", "conflict", None, m.clone()),
            E::UpstreamReply(status, m) => (
                *status,
                if *status < 500 {
                    "invalid_request_error"
                } else {
                    "api_error"
                },
                "upstream_error",
                None,
                m.clone(),
            ),
            E::OriginNotAllowed => (
                403,
                "invalid_request_error",
                "origin_not_allowed",
                Some("origin"),
                "This origin may not call the API from a browser ([cors] allow_origins).".into(),
            ),
            E::MethodNotAllowed(allow) => (
                405,
                "invalid_request_error",
                "method_not_allowed",
                None,
                format!("This path takes {allow} only."),
            ),
            E::RequestTimeout(ms) => (
                408,
                "invalid_request_error",
                "request_timeout",
                None,
                format!("The request body did not arrive within {ms} ms."),
            ),
            E::RequestTooLarge(limit) => (
                413,
                "invalid_request_error",
                "request_too_large",
                None,
                format!("The request body is larger than the limit of {limit} bytes."),
            ),
            E::HeadersTooLarge(count, bytes) => (
                431,
                "invalid_request_error",
                "request_headers_too_large",
                None,
                format!(
                    "The request has {count} headers of {bytes} bytes; the gateway sends at \
                     most {MAX_HEADERS} headers of {MAX_HEADER_BYTES} bytes upstream."
                ),
            ),
            E::RateLimited { message, .. } => (
                429,
                "rate_limit_error",
                "rate_limit_exceeded",
                None,
                message.clone(),
            ),
            E::UpstreamError(m) => (502, "api_error", "upstream_error", None, m.clone()),
            E::NoHealthyUpstream(pool) => (
                503,
                "api_error",
                "no_healthy_upstream",
                None,
                format!("No healthy upstream in pool '{pool}'."),
            ),
            E::LimiterUnavailable => (
                503,
                "api_error",
                "rate_limiter_unavailable",
                None,
                "The shared rate limiter cannot be reached; retry in a moment.".into(),
            ),
            E::StoreUnavailable => (
                503,
                "api_error",
                "usage_store_unavailable",
                None,
                "The gateway cannot record usage now (its store is full); retry in a moment."
                    .into(),
            ),
            E::UpstreamTimeout(m) => (504, "api_error", "upstream_timeout", None, m.clone()),
            E::ShuttingDown => (
                503,
                "api_error",
                "shutting_down",
                None,
                "The gateway is shutting down; retry, another instance will answer.".into(),
            ),
            E::Internal(m) => (500, "api_error", "internal_error", None, m.clone()),
        };
        ErrorParts {
            status,
            kind,
            code,
            param,
            message,
        }
    }

    pub fn status(&self) -> u16 {
        self.parts().status
    }

    /// Why, in a word, for the metrics: the limit of a 429, else the code.
    pub fn reason(&self) -> &'static str {
        match self {
            GatewayError::RateLimited { reason, .. } => reason,
            other => other.parts().code,
        }
    }

    /// The OpenAI-shaped JSON body.
    pub fn body(&self) -> Vec<u8> {
        let p = self.parts();
        let v = json!({"error": {"message": p.message, "type": p.kind, "param": p.param, "code": p.code}});
        v.to_string().into_bytes()
    }

    /// The body in the error shape of the request's API. Anthropic's names its `type` by
    /// status (what its SDKs turn into exception classes); the gateway's `code` stays
    /// readable in the message.
    pub fn body_in(&self, shape: ErrorShape, request_id: &str) -> Vec<u8> {
        match shape {
            ErrorShape::OpenAi => self.body(),
            ErrorShape::Anthropic => {
                let p = self.parts();
                let kind = anthropic_kind(p.status);
                // Anthropic's clients send the key in `x-api-key`: say so.
                let message = if matches!(self, GatewayError::InvalidApiKey) {
                    "Incorrect or missing API key. Send it as 'x-api-key: <key>' (or \
                     'Authorization: Bearer <key>')."
                        .to_string()
                } else {
                    p.message
                };
                let message = format!("{message} ({})", p.code);
                json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id})
                    .to_string()
                    .into_bytes()
            }
        }
    }
}

/// Anthropic's error `type` for a status (what its SDKs turn into exception classes).
pub fn anthropic_kind(status: u16) -> &'static str {
    match status {
        400 | 405 | 409 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Which API's error shape a request gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"error": {"message", "type", "param", "code"}}`.
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}, "request_id"}`.
    Anthropic,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_not_found_names_the_model_param() {
        let e = GatewayError::ModelNotFound("gpt-x".into());
        let v: serde_json::Value = serde_json::from_slice(&e.body()).expect("json");
        assert_eq!(e.status(), 404);
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
    }

    #[test]
    fn errors_without_param_write_null() {
        let v: serde_json::Value =
            serde_json::from_slice(&GatewayError::InvalidApiKey.body()).expect("json");
        assert!(v["error"]["param"].is_null());
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
}
