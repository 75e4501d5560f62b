//! A reply's body as the gateway writes it to an HTTP/1 client, without the I/O: how the body
//! is framed (`Framing::of_reply`), and for each piece the bytes that carry it (a chunk's size
//! line, the piece, what ends it). A body of known length gets no more than its length, and one
//! that ends short of it is reported, so the reply is cut rather than ended.

use bytes::Bytes;

/// How a reply's body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (a reply to HEAD; 1xx, 204, 304).
    None,
    /// In chunks.
    Chunked,
    /// As it is, this many bytes more: what would go past them is not written.
    Length(u64),
    /// As it is, to the close.
    Close,
}

impl Framing {
    /// The framing of a reply with `status` and `headers` to a request that was HEAD or not
    /// (RFC 9112 §6.3 from the sender's side). A length that cannot be read counts as none:
    /// the reply then ends with the close.
    pub fn of_reply(head: bool, status: u16, headers: &http::HeaderMap) -> Framing {
        if head || matches!(status, 100..=199 | 204 | 304) {
            Framing::None
        } else if super::framing::chunked(headers) {
            Framing::Chunked
        } else if let Ok(Some(n)) = super::framing::content_length(headers) {
            Framing::Length(n)
        } else {
            Framing::Close
        }
    }
}

/// The bytes that carry one piece of a body: a chunk's size line, the piece, and what ends it
/// (a chunk's CRLF, the last chunk), to be written in this order.
#[derive(Debug, Default)]
pub struct Parts {
    /// At most 16 hex digits and a CRLF.
    line: [u8; 18],
    line_len: usize,
    pub data: Option<Bytes>,
    pub end: &'static [u8],
}

impl Parts {
    pub fn size_line(&self) -> &[u8] {
        &self.line[..self.line_len]
    }

    /// The parts as one piece of bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let data = self.data.as_deref().unwrap_or_default();
        [self.size_line(), data, self.end].concat()
    }
}

/// A body being written, by its framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyWriter {
    framing: Framing,
}

impl BodyWriter {
    pub fn new(framing: Framing) -> BodyWriter {
        BodyWriter { framing }
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// What to write for `piece` (`None` or empty: nothing new), ending the body when `done`,
    /// and whether the body ended short of its length (then the parts hold what there was,
    /// and the reply must be cut). `None` parts: nothing to write.
    pub fn piece(&mut self, piece: Option<Bytes>, done: bool) -> (Option<Parts>, bool) {
        let mut piece = piece.filter(|p| !p.is_empty());
        let chunked = match &mut self.framing {
            Framing::None => return (None, false),
            Framing::Chunked => true,
            Framing::Close => false,
            Framing::Length(left) => {
                if let Some(p) = &mut piece {
                    let fits = usize::try_from(*left).map_or(p.len(), |l| l.min(p.len()));
                    p.truncate(fits);
                    *left -= fits as u64;
                }
                piece = piece.filter(|p| !p.is_empty());
                let short = done && *left > 0;
                return (
                    piece.map(|p| Parts {
                        data: Some(p),
                        ..Parts::default()
                    }),
                    short,
                );
            }
        };
        if !chunked {
            return (
                piece.map(|p| Parts {
                    data: Some(p),
                    ..Parts::default()
                }),
                false,
            );
        }
        if piece.is_none() && !done {
            return (None, false);
        }
        let mut parts = Parts::default();
        if let Some(p) = &piece {
            let mut rest = &mut parts.line[..];
            let _ = std::io::Write::write_fmt(&mut rest, format_args!("{:X}\r\n", p.len()));
            parts.line_len = 18 - rest.len();
        }
        parts.end = match (piece.is_some(), done) {
            (true, true) => b"\r\n0\r\n\r\n",
            (true, false) => b"\r\n",
            (false, _) => b"0\r\n\r\n",
        };
        parts.data = piece;
        (Some(parts), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(framing: Framing, pieces: &[(&'static str, bool)]) -> (String, bool) {
        let mut w = BodyWriter::new(framing);
        let mut out = Vec::new();
        let mut short = false;
        for (p, done) in pieces {
            let (parts, s) = w.piece(Some(Bytes::from_static(p.as_bytes())), *done);
            out.extend(parts.map(|p| p.to_vec()).unwrap_or_default());
            short |= s;
        }
        (String::from_utf8(out).expect("utf-8"), short)
    }

    #[test]
    fn each_framing_writes_its_pieces_as_rfc_9112_frames_them() {
        assert_eq!(
            write(
                Framing::Chunked,
                &[("hello", false), ("", false), ("!", true)]
            ),
            ("5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n".into(), false)
        );
        assert_eq!(
            write(Framing::Chunked, &[("hi", false), ("", true)]),
            ("2\r\nhi\r\n0\r\n\r\n".into(), false)
        );
        assert_eq!(
            write(Framing::Length(5), &[("hel", false), ("lo, world", true)]),
            ("hello".into(), false)
        );
        assert_eq!(
            write(Framing::Length(5), &[("hel", true)]),
            ("hel".into(), true)
        );
        assert_eq!(
            write(Framing::Close, &[("a", false), ("b", true)]),
            ("ab".into(), false)
        );
        assert_eq!(write(Framing::None, &[("body", true)]), ("".into(), false));
    }

    #[test]
    fn the_framing_of_a_reply_follows_its_method_status_and_fields() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = http::HeaderMap::new();
            for (k, v) in pairs {
                m.append(*k, http::HeaderValue::from_static(v));
            }
            m
        };
        let cl = h(&[("content-length", "5")]);
        assert_eq!(Framing::of_reply(true, 200, &cl), Framing::None);
        assert_eq!(Framing::of_reply(false, 304, &cl), Framing::None);
        assert_eq!(Framing::of_reply(false, 200, &cl), Framing::Length(5));
        let te = h(&[
            ("transfer-encoding", "gzip, chunked"),
            ("content-length", "5"),
        ]);
        assert_eq!(Framing::of_reply(false, 200, &te), Framing::Chunked);
        let not_last = h(&[("transfer-encoding", "chunked, gzip")]);
        assert_eq!(Framing::of_reply(false, 200, &not_last), Framing::Close);
        assert_eq!(
            Framing::of_reply(false, 200, &h(&[("content-length", "x")])),
            Framing::Close
        );
    }
}
