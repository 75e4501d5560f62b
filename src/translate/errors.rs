//! A provider's error, in a reply or in the middle of a stream, in the client API's own shape
//! and status. Anthropic's `overloaded_error` (529) is a 503 to OpenAI's clients, which know
//! no 529 (and retry a 503); an OpenAI error keeps its status for Anthropic's clients, its
//! `type` named by that status as Anthropic's API names it.

use serde_json::{Value, json};

/// OpenAI's `type` and `code` for an Anthropic error type.
fn openai_kind(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "invalid_request_error" => ("invalid_request_error", "invalid_request"),
        "authentication_error" => ("authentication_error", "invalid_api_key"),
        "permission_error" => ("permission_error", "permission_denied"),
        "not_found_error" => ("invalid_request_error", "not_found"),
        "request_too_large" => ("invalid_request_error", "request_too_large"),
        "rate_limit_error" => ("rate_limit_error", "rate_limit_exceeded"),
        "overloaded_error" => ("server_error", "overloaded"),
        "timeout_error" => ("server_error", "timeout"),
        "billing_error" => ("insufficient_quota", "billing_error"),
        "budget_exhausted" => ("insufficient_quota", "budget_exhausted"),
        _ => ("server_error", "upstream_error"),
    }
}

/// An OpenAI error object (`{"error": …}`) for an Anthropic error.
pub fn openai_error(kind: &str, message: &str) -> Value {
    let (t, code) = openai_kind(kind);
    json!({"error": {"message": message, "type": t, "param": null, "code": code}})
}

/// The status an OpenAI client gets for a provider's.
pub fn openai_status(status: u16) -> u16 {
    match status {
        529 => 503,
        s => s,
    }
}

/// An Anthropic error reply's body as OpenAI's, or None when it is not one.
pub fn anthropic_to_openai(body: &[u8]) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?;
    let kind = e.get("type").and_then(Value::as_str)?;
    let message = e.get("message").and_then(Value::as_str).unwrap_or("");
    Some(openai_error(kind, message).to_string().into_bytes())
}

/// Anthropic's error `type` for an OpenAI error's code or type (in a stream, where no status
/// says it).
pub fn anthropic_kind(kind: &str) -> &str {
    match kind {
        "invalid_request_error" | "invalid_request" | "invalid_parameter" => {
            "invalid_request_error"
        }
        "rate_limit_exceeded" | "rate_limit_error" | "requests" | "tokens" => "rate_limit_error",
        "insufficient_quota" => "billing_error",
        "budget_exhausted" => "budget_exhausted",
        "overloaded" | "overloaded_error" => "overloaded_error",
        _ => "api_error",
    }
}

/// An OpenAI error reply's body as Anthropic's, or None when it is not one.
pub fn openai_to_anthropic(status: u16, body: &[u8]) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?;
    let message = e.get("message").and_then(Value::as_str).unwrap_or("");
    let out = json!({"type": "error", "error": {"type": crate::error::anthropic_kind(status), "message": message}});
    Some(out.to_string().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Anthropic's error shape, from its API reference ("Errors").
    #[test]
    fn anthropic_errors_read_as_openai_errors() {
        let body = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011"}"#;
        let v: Value =
            serde_json::from_slice(&anthropic_to_openai(body).expect("an error")).expect("json");
        assert_eq!(v["error"]["type"], "server_error");
        assert_eq!(v["error"]["code"], "overloaded");
        assert_eq!(v["error"]["message"], "Overloaded");
        assert_eq!(openai_status(529), 503);
        assert_eq!(anthropic_to_openai(b"<html>"), None);
    }
}
