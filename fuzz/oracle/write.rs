//! Runs the gateway's reply writer (`modelgate::http1::writer`) on a reply's header fields and
//! a sequence of body pieces, and checks that an RFC 9112 reader (the oracle) gets back
//! exactly what was written, or sees the reply cut when the writer said it was cut short.

use bytes::Bytes;
use modelgate::http1::writer::{BodyWriter, Framing};

use super::rfc9112::{self, Framed};

/// A reply's header as the writer's caller writes it (status line, the fields, CRLF).
pub fn header(status: u16, fields: &[(&str, &str)]) -> Vec<u8> {
    let mut h = format!("HTTP/1.1 {status} X\r\n");
    for (k, v) in fields {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h.into_bytes()
}

/// Writes `pieces` (each with its `done`; the body is ended after them if none was) and
/// returns `None` when the oracle reads the reply as written, else what differs.
pub fn disagreement(
    head: bool,
    status: u16,
    fields: &[(&str, &str)],
    pieces: &[(Vec<u8>, bool)],
) -> Option<String> {
    let mut map = http::HeaderMap::new();
    for (k, v) in fields {
        map.append(
            http::HeaderName::from_bytes(k.as_bytes()).ok()?,
            http::HeaderValue::from_str(v).ok()?,
        );
    }
    let framing = Framing::of_reply(head, status, &map);
    let mut w = BodyWriter::new(framing);
    let mut wire = header(status, fields);
    let mut sent = Vec::new();
    let mut short = false;
    let mut ended = false;
    for (piece, done) in pieces {
        sent.extend_from_slice(piece);
        let (parts, s) = w.piece(Some(Bytes::copy_from_slice(piece)), *done);
        wire.extend(parts.map(|p| p.to_vec()).unwrap_or_default());
        short |= s;
        if *done {
            ended = true;
            break;
        }
    }
    if !ended {
        let (parts, s) = w.piece(None, true);
        wire.extend(parts.map(|p| p.to_vec()).unwrap_or_default());
        short |= s;
    }
    let read = rfc9112::reply(&wire, head);
    let expected: Vec<u8> = match framing {
        Framing::None => Vec::new(),
        Framing::Length(n) => sent[..sent.len().min(n as usize)].to_vec(),
        Framing::Chunked | Framing::Close => sent,
    };
    match (&read.framed, short) {
        (Framed::Cut, true) => None,
        (
            Framed::Whole {
                body, trailing: 0, ..
            },
            false,
        ) if *body == expected => None,
        (got, _) => Some(format!(
            "{framing:?} (short: {short}) wrote {:?}, read as {got:?}, meant {:?}",
            wire.escape_ascii().to_string(),
            expected.escape_ascii().to_string()
        )),
    }
}
