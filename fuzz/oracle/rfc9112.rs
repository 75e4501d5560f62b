//! An HTTP/1.1 reply's framing, written from RFC 9112 section 6 (message body length), §7.1
//! (chunked coding) and §9.3 (persistence) alone: the oracle the gateway's own decoder and
//! writer are checked against (fuzz/fuzz_targets/h1_reply.rs, h1_writer.rs and
//! tests/http1_framing.rs). It reads a whole byte string at once, with none of the decoder's
//! code: only the header's syntax is httparse's (with the options the decoder parses replies
//! with), as both sides must agree on what a header is before framing can be compared.
//!
//! Where the RFC leaves a recipient a choice, or where it says a message "ought to be handled
//! as an error", the verdict carries `may_fail`: the decoder may refuse such a reply, but if
//! it reads it, it must read it as here.

/// What a reply, read whole from `bytes` to the end of the connection, frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framed {
    /// The reply ends within the bytes: its final status, body (decoded) and whether the
    /// connection may carry another request (`None`: the RFC leaves it open).
    Whole {
        status: u16,
        body: Vec<u8>,
        reusable: Option<bool>,
        /// Bytes after the reply's end (a next reply the upstream had no business sending).
        trailing: usize,
    },
    /// The connection ends before the reply does.
    Cut,
    /// The framing is broken: no reading of it is right.
    Invalid,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub framed: Framed,
    /// The decoder may refuse the reply instead (a choice the RFC leaves, or a limit).
    pub may_fail: bool,
}

/// The most informational replies the decoder reads before the final one.
pub const MAX_INFORMATIONAL: usize = 16;
/// The decoder's limits on a chunk-size line and on the trailer section.
pub const MAX_CHUNK_LINE: usize = 4096;
pub const MAX_TRAILERS: usize = 64 * 1024;

/// The framing of the reply in `bytes` to a request that was `HEAD` or not.
pub fn reply(bytes: &[u8], head: bool) -> Verdict {
    let mut may_fail = false;
    let mut at = 0;
    let mut informational = 0;
    loop {
        let Some(h) = header(&bytes[at..]) else {
            return Verdict {
                framed: Framed::Invalid,
                may_fail: true,
            };
        };
        let h = match h {
            Parsed::Partial => {
                return Verdict {
                    framed: Framed::Cut,
                    may_fail,
                };
            }
            Parsed::Bad => {
                return Verdict {
                    framed: Framed::Invalid,
                    may_fail,
                };
            }
            Parsed::Done(h) => h,
        };
        at += h.len;
        if h.status < 100 {
            // Three digits, but no status the http crate (or anyone) knows.
            may_fail = true;
        }
        if (100..200).contains(&h.status) && h.status != 101 {
            informational += 1;
            if informational >= MAX_INFORMATIONAL {
                may_fail = true;
            }
            continue;
        }
        return body(&bytes[at..], &h, head, may_fail);
    }
}

struct Header {
    status: u16,
    /// HTTP/1.1 (else 1.0).
    v11: bool,
    len: usize,
    fields: Vec<(String, Vec<u8>)>,
}

enum Parsed {
    Partial,
    Bad,
    Done(Header),
}

/// `None`: past what the decoder takes (too many fields).
fn header(bytes: &[u8]) -> Option<Parsed> {
    let mut fields = vec![httparse::EMPTY_HEADER; 4096];
    let mut resp = httparse::Response::new(&mut fields);
    let mut config = httparse::ParserConfig::default();
    config.allow_spaces_after_header_name_in_responses(true);
    config.allow_obsolete_multiline_headers_in_responses(true);
    let len = match config.parse_response(&mut resp, bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Some(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return None,
        Err(_) => return Some(Parsed::Bad),
    };
    if resp.headers.len() > 256 {
        return None;
    }
    Some(Parsed::Done(Header {
        status: resp.code.unwrap_or(0),
        v11: resp.version == Some(1),
        len,
        fields: resp
            .headers
            .iter()
            .map(|f| (f.name.to_ascii_lowercase(), f.value.to_vec()))
            .collect(),
    }))
}

impl Header {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The comma-separated elements of every `name` field, trimmed, empty ones left out
    /// (RFC 9110 §5.6.1).
    fn list(&self, name: &str) -> Vec<Vec<u8>> {
        self.values(name)
            .flat_map(|v| v.split(|b| *b == b','))
            .map(|e| e.trim_ascii().to_ascii_lowercase())
            .filter(|e| !e.is_empty())
            .collect()
    }

    /// RFC 9112 §9.3: persistent unless `close` is a connection option; HTTP/1.0 only with
    /// `keep-alive`.
    fn persistent(&self) -> bool {
        let options = self.list("connection");
        if options.iter().any(|o| o == b"close") {
            return false;
        }
        self.v11 || options.iter().any(|o| o == b"keep-alive")
    }
}

/// §6.3, in its order, for a reply.
fn body(rest: &[u8], h: &Header, head: bool, mut may_fail: bool) -> Verdict {
    let whole = |body: Vec<u8>, reusable: Option<bool>, trailing: usize, may_fail| Verdict {
        framed: Framed::Whole {
            status: h.status,
            body,
            reusable,
            trailing,
        },
        may_fail,
    };
    let te = h.list("transfer-encoding");
    let has_te = h.values("transfer-encoding").next().is_some();
    let lengths: Vec<&[u8]> = h.values("content-length").collect();
    let length = content_length(&lengths);
    // (1) HEAD, 1xx, 204 and 304: no body, whatever the fields say. The decoder checks a
    // length even here (it is passed on to the client), so a broken one may be refused.
    if head || (100..200).contains(&h.status) || h.status == 204 || h.status == 304 {
        if !has_te && length.is_err() {
            may_fail = true;
        }
        // Transfer-Encoding in an HTTP/1.0 reply: faulty framing, closed after (§6.1).
        let reusable = h.status != 101 && h.persistent() && (h.v11 || !has_te);
        return whole(Vec::new(), Some(reusable), rest.len(), may_fail);
    }
    if has_te {
        // (3) Transfer-Encoding overrides Content-Length; both at once "ought to be handled
        // as an error" (and the connection closed), so a decoder may refuse it, and if it
        // reads it, whether it keeps the connection is its choice.
        let both = !lengths.is_empty();
        may_fail |= both;
        let reuse = |r: bool| if both { None } else { Some(r) };
        // A reply with Transfer-Encoding in HTTP/1.0: faulty framing, closed after (§6.1).
        let persistent = h.persistent() && h.v11;
        if te.last().map(Vec::as_slice) == Some(b"chunked".as_slice()) {
            return match chunked(rest) {
                Chunked::Whole { body, end, lenient } => whole(
                    body,
                    reuse(persistent),
                    rest.len() - end,
                    may_fail || lenient,
                ),
                Chunked::Cut { lenient } => Verdict {
                    framed: Framed::Cut,
                    may_fail: may_fail || lenient,
                },
                Chunked::Invalid => Verdict {
                    framed: Framed::Invalid,
                    may_fail,
                },
            };
        }
        // Not chunked last: the body runs to the close.
        return whole(rest.to_vec(), Some(false), 0, may_fail);
    }
    match length {
        // (5) An invalid length is an unrecoverable framing error.
        Err(()) => Verdict {
            framed: Framed::Invalid,
            may_fail,
        },
        // (6) A length.
        Ok(Some(n)) => match usize::try_from(n) {
            Ok(n) if n <= rest.len() => whole(
                rest[..n].to_vec(),
                Some(h.persistent()),
                rest.len() - n,
                may_fail,
            ),
            _ => Verdict {
                framed: Framed::Cut,
                may_fail,
            },
        },
        // (7) A reply with neither: the body runs to the close.
        Ok(None) => whole(rest.to_vec(), Some(false), 0, may_fail),
    }
}

/// §6.3 (5) with RFC 9110 §8.6: identical values (repeated, or in a list) are one length;
/// anything else is invalid.
fn content_length(values: &[&[u8]]) -> Result<Option<u64>, ()> {
    let mut length = None;
    for v in values {
        for part in v.split(|b| *b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return Err(());
            }
            let n: u64 = std::str::from_utf8(part)
                .map_err(|_| ())?
                .parse()
                .map_err(|_| ())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        }
    }
    Ok(length)
}

enum Chunked {
    /// The body decoded; `end`: where the chunked coding ended; `lenient`: it took a choice
    /// the RFC leaves, or went past a limit of the decoder's.
    Whole {
        body: Vec<u8>,
        end: usize,
        lenient: bool,
    },
    Cut {
        lenient: bool,
    },
    Invalid,
}

/// §7.1: `*chunk last-chunk trailer-section CRLF`. Its lines end with CRLF; one that ends
/// with a lone LF is lenient (§2.2 lets a recipient take it for the start-line and fields
/// only; the decoder takes it here too). The decoder's line limits count a line's CR, and
/// two bytes for every trailer line: near them, a refusal is allowed.
fn chunked(bytes: &[u8]) -> Chunked {
    let mut at = 0;
    let mut body = Vec::new();
    let mut lenient = false;
    loop {
        let Some((line, next)) = next_line(bytes, at) else {
            lenient |= bytes.len() - at >= MAX_CHUNK_LINE - 1;
            return Chunked::Cut { lenient };
        };
        lenient |= next - at >= MAX_CHUNK_LINE || lone_lf(bytes, next);
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 {
            return Chunked::Invalid;
        }
        match chunk_ext(&line[digits..]) {
            Ext::Valid => {}
            // Not the grammar's, but past the size: a recipient MUST ignore extensions it
            // does not know, and the decoder ignores what follows the size's end.
            Ext::Odd => lenient = true,
            Ext::Invalid => return Chunked::Invalid,
        }
        // More digits than a u64 holds (leading zeros) is a limit, not a grammar rule.
        let hex = &line[..digits];
        let significant = &hex[hex.iter().take_while(|b| **b == b'0').count()..];
        if digits > 16 {
            lenient = true;
        }
        if significant.len() > 16 {
            return Chunked::Cut { lenient: true };
        }
        let size = u64::from_str_radix(std::str::from_utf8(hex).unwrap_or("0"), 16).unwrap_or(0);
        at = next;
        if size == 0 {
            // The trailer section: field lines to an empty one.
            let start = at;
            loop {
                let Some((line, next)) = next_line(bytes, at) else {
                    lenient |= (bytes.len() - start) * 2 >= MAX_TRAILERS;
                    return Chunked::Cut { lenient };
                };
                lenient |= lone_lf(bytes, next);
                at = next;
                if (at - start) * 2 >= MAX_TRAILERS {
                    lenient = true;
                }
                if line.is_empty() {
                    return Chunked::Whole {
                        body,
                        end: at,
                        lenient,
                    };
                }
                // A trailer field the decoder passes over (it keeps no trailers): its syntax
                // is not the framing's.
                if !field_line(line) {
                    lenient = true;
                }
            }
        }
        let Ok(size) = usize::try_from(size) else {
            return Chunked::Cut { lenient };
        };
        if bytes.len() - at < size {
            return Chunked::Cut { lenient };
        }
        body.extend_from_slice(&bytes[at..at + size]);
        at += size;
        // The data's CRLF.
        match next_line(bytes, at) {
            None => {
                // Not whole yet: cut, unless what came already is not the CRLF.
                let rest = &bytes[at..];
                if rest.is_empty() || rest == b"\r" {
                    return Chunked::Cut { lenient };
                }
                return Chunked::Invalid;
            }
            Some((l, _)) if !l.is_empty() => return Chunked::Invalid,
            Some((_, next)) => {
                lenient |= lone_lf(bytes, next);
                at = next;
            }
        }
    }
}

/// The line at `at` without its end (CRLF or a lone LF), and where the next starts.
fn next_line(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let lf = bytes[at..].iter().position(|b| *b == b'\n')?;
    let mut line = &bytes[at..at + lf];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    Some((line, at + lf + 1))
}

/// Whether the line that ends before `next` ends with a lone LF.
fn lone_lf(bytes: &[u8], next: usize) -> bool {
    next < 2 || bytes[next - 2] != b'\r'
}

enum Ext {
    Valid,
    Odd,
    Invalid,
}

fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// What follows a chunk's size: `*( BWS ";" BWS name [ BWS "=" BWS value ] )` (§7.1.1),
/// value a token or a quoted string.
fn chunk_ext(rest: &[u8]) -> Ext {
    if rest.is_empty() {
        return Ext::Valid;
    }
    if !matches!(rest[0], b' ' | b'\t' | b';') {
        return Ext::Invalid;
    }
    let ws = |s: &[u8], mut i: usize| {
        while i < s.len() && matches!(s[i], b' ' | b'\t') {
            i += 1;
        }
        i
    };
    let token = |s: &[u8], i: usize| {
        let mut j = i;
        while j < s.len() && tchar(s[j]) {
            j += 1;
        }
        j
    };
    let mut i = 0;
    loop {
        i = ws(rest, i);
        if i == rest.len() {
            return Ext::Valid;
        }
        if rest[i] != b';' {
            return Ext::Odd;
        }
        i = ws(rest, i + 1);
        let j = token(rest, i);
        if j == i {
            return Ext::Odd;
        }
        i = ws(rest, j);
        if i < rest.len() && rest[i] == b'=' {
            i = ws(rest, i + 1);
            if i < rest.len() && rest[i] == b'"' {
                i += 1;
                loop {
                    match rest.get(i) {
                        None => return Ext::Odd,
                        Some(b'"') => {
                            i += 1;
                            break;
                        }
                        Some(b'\\') => i += 2,
                        Some(b) if *b == b'\t' || *b == b' ' || *b >= 0x21 && *b != 0x7f => i += 1,
                        Some(_) => return Ext::Odd,
                    }
                }
            } else {
                let j = token(rest, i);
                if j == i {
                    return Ext::Odd;
                }
                i = j;
            }
        }
    }
}

/// `field-name ":" OWS field-value OWS` (RFC 9110 §5), loosely: a token, a colon.
fn field_line(line: &[u8]) -> bool {
    let name = line.iter().take_while(|b| tchar(**b)).count();
    name > 0 && line.get(name) == Some(&b':')
}
