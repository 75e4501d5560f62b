//! Runs the gateway's upstream reply decoder (`modelgate::upstream::Conn`) on a reply split
//! into the given reads, and checks what it read against the RFC 9112 oracle.

use modelgate::config::headers::PassHeaders;
use modelgate::upstream::{Conn, Request};
use pingora_core::protocols::Stream;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::RequestHeader;

use super::rfc9112::{Framed, Verdict};
use super::script_io::ScriptIo;

/// What the decoder made of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub status: u16,
    pub body: Vec<u8>,
    /// Whether the connection would go back to the pool.
    pub reusable: bool,
}

/// The reply in `pieces` (one a read, then the close), to a HEAD request or a GET; with
/// `keep`, as forwarding reads it (only the fields a client may get copied into its header).
pub fn decode(
    pieces: Vec<Vec<u8>>,
    head: bool,
    keep: Option<&PassHeaders>,
) -> Result<Decoded, String> {
    let stream: Stream = Box::new(ScriptIo::new(pieces));
    let peer = HttpPeer::new("127.0.0.1:9", false, String::new());
    let mut conn = Conn::new(stream, &peer);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let method = if head { "HEAD" } else { "GET" };
        let mut req = RequestHeader::build(method, b"/v1/x", None).map_err(|e| e.to_string())?;
        req.insert_header("host", "x").map_err(|e| e.to_string())?;
        let req = Request::of(&req).map_err(|e| e.to_string())?;
        conn.send(&req, b"").await.map_err(|e| e.to_string())?;
        conn.read_final_header(keep)
            .await
            .map_err(|e| e.to_string())?;
        let status = conn.response_header().map_or(0, |h| h.status.as_u16());
        let mut body = Vec::new();
        while let Some(piece) = conn.read_response_body().await.map_err(|e| e.to_string())? {
            body.extend_from_slice(&piece);
        }
        Ok(Decoded {
            status,
            body,
            reusable: conn.keeps_connection(),
        })
    })
}

/// `None` when the decoder read `reply` as the RFC frames it, else what differs. `one_read`:
/// the reply came in one read, so bytes after it were read with it.
pub fn disagreement(
    want: &Verdict,
    got: &Result<Decoded, String>,
    one_read: bool,
) -> Option<String> {
    match (&want.framed, got) {
        (
            Framed::Whole {
                status,
                body,
                reusable,
                trailing,
            },
            Ok(g),
        ) => {
            if *status != g.status || *body != g.body {
                return Some(format!(
                    "read {} {:?}, the RFC frames {status} {:?}",
                    g.status,
                    g.body.escape_ascii().to_string(),
                    body.escape_ascii().to_string()
                ));
            }
            // Bytes past the reply: whether they were read before the decoder was done
            // depends on the splits. Read with the reply, they make the connection unfit
            // for another request (its next reply would be read from them).
            match reusable {
                Some(r) if *trailing == 0 && *r != g.reusable => {
                    Some(format!("kept the connection: {}, the RFC: {r}", g.reusable))
                }
                _ if *trailing > 0 && one_read && g.reusable => Some(format!(
                    "kept the connection with {trailing} bytes after the reply read"
                )),
                _ => None,
            }
        }
        (Framed::Whole { .. }, Err(e)) if !want.may_fail => Some(format!(
            "refused a reply the RFC frames ({:?}): {e}",
            want.framed
        )),
        (Framed::Cut | Framed::Invalid, Ok(g)) => Some(format!(
            "read {g:?} from a reply the RFC finds {:?}",
            want.framed
        )),
        _ => None,
    }
}
