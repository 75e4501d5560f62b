//! Error replies of the mock, OpenAI-shaped (`{"error": {message, type, param, code}}`):
//! bad requests, unknown endpoints, too-large bodies and the statuses forced by
//! `x-mock-status`.

use serde_json::{Value, json};

use super::replies::Reply;

fn error_body(message: &str, error_type: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": error_type, "param": null, "code": code}})
}

pub(super) fn error_reply(status: u16, error_type: &str, message: &str, code: &str) -> Reply {
    Reply::json(status, &error_body(message, error_type, code))
}

pub(super) fn bad_request(message: &str) -> Reply {
    error_reply(400, "invalid_request_error", message, "invalid_request")
}

pub(super) fn not_found() -> Reply {
    error_reply(
        404,
        "invalid_request_error",
        "unknown endpoint on the mock upstream",
        "not_found",
    )
}

/// The reply for `x-mock-status: S`: Anthropic's error shape on its API's paths.
pub(super) fn forced_error(status: u16, path: &str) -> Reply {
    if path.starts_with("/v1/messages") {
        let kind = match status {
            400 => "invalid_request_error",
            401 => "authentication_error",
            402 => "billing_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            504 => "timeout_error",
            529 => "overloaded_error",
            _ => "api_error",
        };
        let body = json!({"type": "error", "error": {"type": kind,
                          "message": format!("mock upstream forced status {status}")},
                          "request_id": "req_mock"});
        return Reply::json(status, &body);
    }
    let error_type = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    error_reply(
        status,
        error_type,
        &format!("mock upstream forced status {status}"),
        "mock_error",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_error_keeps_the_status() {
        assert_eq!(forced_error(429, "/v1/chat/completions").status, 429);
    }
}
