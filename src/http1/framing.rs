//! How a message's body is framed (RFC 9112 §6.3): by chunks, by a length, or by the close.

/// The body's length from `Content-Length`: identical duplicates (repeated, or in a comma
/// list) are one length (RFC 9110 §8.6); differing or unreadable ones are a broken message.
pub fn content_length(headers: &http::HeaderMap) -> pingora_error::Result<Option<u64>> {
    use pingora_error::{Error, ErrorType};
    let mut length = None;
    for v in headers.get_all(http::header::CONTENT_LENGTH) {
        for part in v.as_bytes().split(|b| *b == b',') {
            let part = part.trim_ascii();
            let n = (!part.is_empty() && part.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(part).ok()?.parse::<u64>().ok())
                .flatten();
            match (n, length) {
                (None, _) => {
                    return Error::e_explain(
                        ErrorType::InvalidHTTPHeader,
                        "invalid Content-Length",
                    );
                }
                (Some(n), Some(l)) if n != l => {
                    return Error::e_explain(
                        ErrorType::InvalidHTTPHeader,
                        "conflicting Content-Length values",
                    );
                }
                (Some(n), _) => length = Some(n),
            }
        }
    }
    Ok(length)
}

/// Whether a message's body goes chunked: its last transfer coding is `chunked` (RFC 9112
/// §6.3). The codings are one list over every `Transfer-Encoding` line, whose empty elements
/// do not count (RFC 9110 §5.6.1): `chunked,` ends with `chunked`. A list that ends otherwise
/// ends with the close.
pub fn chunked(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .rfind(|coding| !coding.is_empty())
        .is_some_and(|last| last.eq_ignore_ascii_case(b"chunked"))
}

/// Whether a message's body has a known end: a length, or chunks. Else its end is the close of
/// the connection, which a cut looks like too.
pub fn framed(headers: &http::HeaderMap) -> bool {
    headers.contains_key(http::header::CONTENT_LENGTH) || chunked(headers)
}
