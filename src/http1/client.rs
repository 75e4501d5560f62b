//! The gateway's side of an HTTP/1.1 exchange with an upstream: the request written in one go,
//! the reply's header parsed (httparse, Pingora's limits), its body read by its framing
//! (a length, chunks, or the close; none after HEAD, 1xx, 204 and 304), and the connection
//! given back for reuse only when the reply was read exactly whole.
//!
//! Pingora's client session holds what it read in buffers of its own for the whole exchange
//! (a 4 KiB header buffer, the reply's header, a 64 KiB body buffer), and a stream keeps its
//! exchange for minutes. Here nothing is buffered while the upstream is quiet: each read takes
//! a buffer on the stack for that poll only and keeps exactly what came; the reply's header is
//! handed to the caller; and bytes of a piece not yet whole are all that stays between reads.
//! The errors are Pingora's (types, retry marks, the "bytes already read" that tells a stale
//! kept connection), so the pool and the error replies read them as they read Pingora's.

use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora_core::protocols::Stream;
use pingora_core::protocols::http::v1::client::http_req_header_to_wire;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType, OrErr, RetryType};
use pingora_http::{IntoCaseHeaderName, RequestHeader, ResponseHeader};
use pingora_timeout::fast_timeout::fast_timeout;

use crate::config::headers::PassHeaders;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

/// Pingora's error type for broken chunked framing.
const INVALID_CHUNK: ErrorType = ErrorType::new("InvalidChunk");
/// Most headers in a reply (Pingora's limit).
const MAX_HEADERS: usize = 256;
/// Largest reply header (Pingora's limit).
const MAX_HEADER_SIZE: usize = 1_048_575;
/// Largest chunk-size line (with its extensions) or trailer section.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;
/// The most one read takes (a stack buffer, for that poll only).
const READ_MAX: usize = 16 * 1024;
/// Bodies up to this size go up in the same write as the header (one copy, one send).
const ONE_WRITE_MAX: usize = 64 * 1024;

/// The most informational replies (`103 Early Hints`…) read before the real one.
const MAX_INFORMATIONAL: usize = 16;

/// A request as it goes up: its header's bytes, written once for every send of a try (a kept
/// connection found closed sends it again on a new one). The header's maps are not held
/// while the reply is awaited, which for a stream may be seconds.
pub struct Request {
    wire: Bytes,
    /// HEAD: the reply has no body.
    head: bool,
}

impl Request {
    pub fn of(req: &RequestHeader) -> pingora_error::Result<Request> {
        let wire = http_req_header_to_wire(req).ok_or_else(|| {
            Error::explain(ErrorType::InvalidHTTPHeader, "request line not writable")
        })?;
        Ok(Request {
            wire: wire.freeze(),
            head: req.method == http::Method::HEAD,
        })
    }
}

/// An exchange on one upstream connection.
pub struct Conn {
    stream: Stream,
    pub read_timeout: Option<Duration>,
    pub write_timeout: Option<Duration>,
    /// Bytes read and not yet used: the rest of a header, or of a body's piece.
    left: BytesMut,
    /// The request asked for no body (HEAD).
    head: bool,
    header: Option<Box<ResponseHeader>>,
    body: Body,
    keepalive: bool,
    /// Body bytes read so far (for error messages).
    received: usize,
}

/// How far the reply's body is read, by its framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// The (final) header is not read yet.
    Unread,
    /// Ends after this many more bytes.
    Length(u64),
    /// Chunked: where in the framing.
    Chunked(Chunk),
    /// Ends with the connection's close.
    Close,
    /// Read whole.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data: this many bytes to go.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines to the empty one (their bytes so far).
    Trailers(usize),
}

impl Conn {
    pub fn new(stream: Stream, peer: &HttpPeer) -> Conn {
        Conn {
            stream,
            read_timeout: peer.options.read_timeout,
            write_timeout: peer.options.write_timeout,
            left: BytesMut::new(),
            head: false,
            header: None,
            body: Body::Unread,
            keepalive: false,
            received: 0,
        }
    }

    /// Writes the request: header and body in one write up to [`ONE_WRITE_MAX`] (one send,
    /// one packet to the upstream), else the header then the body. A request with a body says
    /// its length (`rewrite_request`): the body goes as it is.
    pub async fn send(&mut self, req: &Request, body: &[u8]) -> pingora_error::Result<()> {
        self.head = req.head;
        let one = body.len() <= ONE_WRITE_MAX;
        let joined;
        let wire: &[u8] = if one && !body.is_empty() {
            let mut both = Vec::with_capacity(req.wire.len() + body.len());
            both.extend_from_slice(&req.wire);
            both.extend_from_slice(body);
            joined = both;
            &joined
        } else {
            &req.wire
        };
        let stream = &mut self.stream;
        let write = async {
            stream.write_all(wire).await?;
            if !one {
                stream.write_all(body).await?;
            }
            stream.flush().await
        };
        let written = match self.write_timeout {
            Some(t) => fast_timeout(t, write)
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
            None => write.await,
        };
        written.map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::TimedOut {
                ErrorType::WriteTimedout
            } else {
                ErrorType::WriteError
            };
            Error::because(kind, "while writing the request", e)
        })
    }

    /// Reads the reply's header past any informational ones (`100`, `102`, `103`…: they say
    /// nothing a client of the API or a health check needs, and a client gets one reply); `101
    /// Switching Protocols` is final. At most `MAX_INFORMATIONAL` are read before it.
    ///
    /// With `keep`, the final header holds only the fields it keeps and those that frame the
    /// reply (`content-length`, `transfer-encoding`, `connection`): the others are never
    /// copied into it (the cheapest way to not pass them on).
    pub async fn read_final_header(
        &mut self,
        keep: Option<&PassHeaders>,
    ) -> pingora_error::Result<()> {
        for _ in 0..MAX_INFORMATIONAL {
            self.read_response_header(keep).await?;
            let status = self.header.as_ref().map(|r| r.status.as_u16());
            if !matches!(status, Some(100 | 102..=199)) {
                return Ok(());
            }
        }
        Error::e_explain(
            ErrorType::InvalidHTTPHeader,
            "the upstream sent informational replies and no reply",
        )
    }

    /// Reads one reply header: an informational one (1xx; the caller reads on) or the final
    /// one, which says how the body is framed.
    pub async fn read_response_header(
        &mut self,
        keep: Option<&PassHeaders>,
    ) -> pingora_error::Result<()> {
        self.header = None;
        loop {
            if !self.left.is_empty() {
                if let Some(header) = self.parse_header(keep)? {
                    self.header = Some(header);
                    return Ok(());
                }
            }
            let already = self.left.len();
            if already > MAX_HEADER_SIZE {
                return Error::e_explain(
                    ErrorType::InvalidHTTPHeader,
                    format!("Response header larger than {MAX_HEADER_SIZE}"),
                );
            }
            let read = match self.read().await {
                Ok(Some(n)) => n,
                Ok(None) => {
                    let mut e = Error::explain(
                        ErrorType::ConnectionClosed,
                        format!("while reading response headers, bytes already read: {already}"),
                    );
                    e.retry = RetryType::ReusedOnly;
                    return Err(e);
                }
                Err(ReadFailed::Timeout) => {
                    return Error::e_explain(
                        ErrorType::ReadTimedout,
                        "while reading response headers",
                    );
                }
                Err(ReadFailed::Io(io)) => {
                    let os = io.raw_os_error().is_some();
                    let mut e = Error::because(
                        ErrorType::ReadError,
                        format!("while reading response headers, bytes already read: {already}"),
                        io,
                    );
                    // A reset of a kept connection; not a TLS error.
                    if os {
                        e.retry = RetryType::ReusedOnly;
                    }
                    return Err(e);
                }
            };
            self.append(read);
        }
    }

    /// Parses a header from what was read: `None` while it is not whole.
    fn parse_header(
        &mut self,
        keep: Option<&PassHeaders>,
    ) -> pingora_error::Result<Option<Box<ResponseHeader>>> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        // What Pingora's parser lets through in replies: a space before a header's colon, and
        // a header folded onto the next line.
        let mut parser = httparse::ParserConfig::default();
        parser.allow_spaces_after_header_name_in_responses(true);
        parser.allow_obsolete_multiline_headers_in_responses(true);
        let end = match parser.parse_response(&mut resp, &self.left) {
            Ok(httparse::Status::Complete(end)) => end,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => {
                return Err(Error::because(
                    ErrorType::InvalidHTTPHeader,
                    format!("buf: {}", self.left.escape_ascii()),
                    e,
                ));
            }
        };
        let status = resp.code.unwrap_or(0);
        let mut header = Box::new(ResponseHeader::build(status, Some(resp.headers.len()))?);
        header.set_version(match resp.version {
            Some(1) => http::Version::HTTP_11,
            Some(0) => http::Version::HTTP_10,
            _ => http::Version::HTTP_09,
        });
        header.set_reason_phrase(resp.reason)?;
        // Names and values stay slices of the bytes read (no copy each), as Pingora's do.
        let base = self.left.as_ptr() as usize;
        let at = |part: &[u8]| (part.as_ptr() as usize - base, part.len());
        let spans: Vec<_> = resp
            .headers
            .iter()
            .filter(|h| keep.is_none_or(|k| kept(k, h.name)))
            .map(|h| (at(h.name.as_bytes()), at(h.value)))
            .collect();
        let read = self.left.split_to(end).freeze();
        self.release_left();
        for ((name, name_len), (value, value_len)) in spans {
            let name = read.slice(name..name + name_len).into_case_header_name();
            let value = pingora_http::header_value_from_raw(read.slice(value..value + value_len));
            header.append_header(name, value).or_err(
                ErrorType::InvalidHTTPHeader,
                "while parsing the reply's header",
            )?;
        }
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3): the length goes.
        let te = header.headers.contains_key(http::header::TRANSFER_ENCODING);
        if te {
            header.remove_header(&http::header::CONTENT_LENGTH);
        }
        if (100..200).contains(&status) && status != 101 {
            // Informational: no body; the final header follows.
            return Ok(Some(header));
        }
        // Checked whatever the body (a bodiless reply's length passes on to the client).
        let length = super::framing::content_length(&header.headers)?;
        self.body = if self.head || matches!(status, 101 | 204 | 304) {
            Body::Done
        } else if te {
            if super::framing::chunked(&header.headers) {
                Body::Chunked(Chunk::Size)
            } else {
                Body::Close
            }
        } else {
            match length {
                Some(n) => Body::Length(n),
                None => Body::Close,
            }
        };
        self.keepalive = status != 101
            && self.body != Body::Close
            && keeps_alive(&header)
            && !(header.version == http::Version::HTTP_10 && te);
        if self.body == Body::Length(0) {
            self.body = Body::Done;
        }
        Ok(Some(header))
    }

    /// The reply's header, once read.
    pub fn response_header(&self) -> Option<&ResponseHeader> {
        self.header.as_deref()
    }

    /// Takes the reply's header away (what the exchange keeps is its framing only).
    pub fn take_response_header(&mut self) -> Option<Box<ResponseHeader>> {
        self.header.take()
    }

    /// Whether the reply's body was read whole.
    pub fn response_done(&self) -> bool {
        self.body == Body::Done
    }

    /// The next piece of the reply's body; `None` once it is whole.
    pub async fn read_response_body(&mut self) -> pingora_error::Result<Option<Bytes>> {
        loop {
            if let Some(piece) = self.take_piece()? {
                return Ok(Some(piece));
            }
            if matches!(self.body, Body::Done | Body::Unread) {
                return Ok(None);
            }
            // The few bytes of a piece not yet whole (a size line, a CRLF) are kept on their
            // own while the upstream is quiet, not with the read they came in.
            if !self.left.is_empty() {
                self.left = BytesMut::from(&self.left[..]);
            }
            match self.read().await {
                Ok(Some(read)) => self.append(read),
                Ok(None) if self.body == Body::Close => {
                    self.body = Body::Done;
                    return Ok(None);
                }
                Ok(None) => return Err(self.cut()),
                Err(ReadFailed::Timeout) => {
                    return Error::e_explain(ErrorType::ReadTimedout, "while reading the body");
                }
                Err(ReadFailed::Io(e)) => {
                    return Err(Error::because(
                        ErrorType::ReadError,
                        "while reading the body",
                        e,
                    ));
                }
            }
        }
    }

    /// The error of a body its upstream closed before its end.
    fn cut(&self) -> Box<Error> {
        let context = match self.body {
            Body::Length(n) => {
                format!(
                    "Peer prematurely closed connection with {n} bytes of body remaining to read"
                )
            }
            _ => format!(
                "Connection prematurely closed without the termination chunk, read {} bytes",
                self.received
            ),
        };
        Error::explain(ErrorType::ConnectionClosed, context)
    }

    /// A piece of the body from what was read, if there is one; moves the framing on.
    fn take_piece(&mut self) -> pingora_error::Result<Option<Bytes>> {
        loop {
            match self.body {
                Body::Unread | Body::Done => return Ok(None),
                Body::Close => {
                    if self.left.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(self.piece(self.left.len())));
                }
                Body::Length(n) => {
                    let Some((piece, left)) = self.up_to(n) else {
                        return Ok(None);
                    };
                    self.body = if left == 0 {
                        Body::Done
                    } else {
                        Body::Length(left)
                    };
                    return Ok(Some(piece));
                }
                Body::Chunked(Chunk::Data(n)) => {
                    let Some((piece, left)) = self.up_to(n) else {
                        return Ok(None);
                    };
                    self.body = Body::Chunked(if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    });
                    return Ok(Some(piece));
                }
                Body::Chunked(Chunk::Size) => {
                    let Some(line) = self.line(MAX_CHUNK_LINE)? else {
                        return Ok(None);
                    };
                    let size = chunk_size(&line)?;
                    self.body = Body::Chunked(if size == 0 {
                        Chunk::Trailers(0)
                    } else {
                        Chunk::Data(size)
                    });
                }
                Body::Chunked(Chunk::DataEnd) => {
                    let Some(line) = self.line(MAX_CHUNK_LINE)? else {
                        return Ok(None);
                    };
                    if !line.is_empty() {
                        return Error::e_explain(
                            INVALID_CHUNK,
                            "a chunk's data is not followed by its CRLF",
                        );
                    }
                    self.body = Body::Chunked(Chunk::Size);
                }
                Body::Chunked(Chunk::Trailers(so_far)) => {
                    let Some(line) = self.line(MAX_TRAILERS - so_far)? else {
                        return Ok(None);
                    };
                    let so_far = so_far + line.len() + 2;
                    self.body = if line.is_empty() {
                        Body::Done
                    } else if so_far >= MAX_TRAILERS {
                        return Error::e_explain(INVALID_CHUNK, "the trailers are too long");
                    } else {
                        Body::Chunked(Chunk::Trailers(so_far))
                    };
                }
            }
        }
    }

    /// Up to `n` bytes of what was read, as a piece of the body, and how many are left to
    /// come; `None` when nothing was read.
    fn up_to(&mut self, n: u64) -> Option<(Bytes, u64)> {
        if self.left.is_empty() {
            return None;
        }
        let take = self
            .left
            .len()
            .min(usize::try_from(n).unwrap_or(usize::MAX));
        Some((self.piece(take), n - take as u64))
    }

    /// The first `n` bytes of what was read, as a piece of the body.
    fn piece(&mut self, n: usize) -> Bytes {
        self.received += n;
        let piece = self.left.split_to(n).freeze();
        self.release_left();
        piece
    }

    /// A whole line (without its CRLF or LF) from what was read, `None` while it is not whole;
    /// longer than `max`, the framing is broken.
    fn line(&mut self, max: usize) -> pingora_error::Result<Option<BytesMut>> {
        let Some(lf) = memchr::memchr(b'\n', &self.left) else {
            if self.left.len() > max {
                return Error::e_explain(INVALID_CHUNK, "a chunk line is too long");
            }
            return Ok(None);
        };
        if lf > max {
            return Error::e_explain(INVALID_CHUNK, "a chunk line is too long");
        }
        let mut line = self.left.split_to(lf + 1);
        self.release_left();
        line.truncate(lf);
        if line.last() == Some(&b'\r') {
            line.truncate(lf - 1);
        }
        Ok(Some(line))
    }

    /// An emptied `left` lets go of the read it was part of (a piece handed on may share it).
    fn release_left(&mut self) {
        if self.left.is_empty() {
            self.left = BytesMut::new();
        }
    }

    fn append(&mut self, read: BytesMut) {
        if self.left.is_empty() {
            self.left = read;
        } else {
            self.left.extend_from_slice(&read);
        }
    }

    /// One read within the read timeout: what came (`None`: the upstream closed).
    async fn read(&mut self) -> Result<Option<BytesMut>, ReadFailed> {
        let read = read_some(&mut self.stream);
        let read = match self.read_timeout {
            Some(t) => fast_timeout(t, read)
                .await
                .map_err(|_| ReadFailed::Timeout)?,
            None => read.await,
        };
        match read {
            Ok(got) if got.is_empty() => Ok(None),
            Ok(got) => Ok(Some(got)),
            Err(e) => Err(ReadFailed::Io(e)),
        }
    }

    /// Whether the connection can carry another request: the reply read exactly whole (no
    /// byte of it, or past it, left over), and neither side said close.
    pub fn keeps_connection(&self) -> bool {
        self.keepalive && self.body == Body::Done && self.left.is_empty()
    }

    /// The connection, `Ok` when it can carry another request (`keeps_connection`).
    pub fn into_stream(self) -> Result<Stream, Stream> {
        if self.keeps_connection() {
            Ok(self.stream)
        } else {
            Err(self.stream)
        }
    }
}

enum ReadFailed {
    Timeout,
    Io(std::io::Error),
}

/// Reads what the stream has, into a buffer that lives for one poll: a quiet upstream holds
/// no buffer. The bytes come back in one of their exact size (empty: the stream closed).
fn read_some(stream: &mut Stream) -> impl Future<Output = std::io::Result<BytesMut>> + '_ {
    std::future::poll_fn(move |cx| {
        let mut buf = [MaybeUninit::<u8>::uninit(); READ_MAX];
        let mut read = ReadBuf::uninit(&mut buf);
        match Pin::new(&mut *stream).poll_read(cx, &mut read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => Poll::Ready(Ok(BytesMut::from(read.filled()))),
        }
    })
}

/// Whether a reply field named `name` (in any case) is kept: `keep` keeps it, or it frames the
/// reply.
fn kept(keep: &PassHeaders, name: &str) -> bool {
    let is = |lower: &str| {
        matches!(lower, "content-length" | "transfer-encoding" | "connection") || keep.keeps(lower)
    };
    // Most names come in lower case (HTTP/2's rule, and most servers' in HTTP/1 too): looked
    // up as they are, neither copied nor checked again.
    if !name.bytes().any(|b| b.is_ascii_uppercase()) {
        return is(name);
    }
    let mut buf = [0u8; 64];
    match buf.get_mut(..name.len()) {
        Some(b) => {
            b.copy_from_slice(name.as_bytes());
            b.make_ascii_lowercase();
            is(std::str::from_utf8(b).unwrap_or_default())
        }
        None => is(&name.to_ascii_lowercase()),
    }
}

/// Whether the upstream keeps the connection open after this reply: HTTP/1.1 unless it says
/// close; HTTP/1.0 only when it says keep-alive.
fn keeps_alive(header: &ResponseHeader) -> bool {
    let mut said = None;
    for v in header.headers.get_all(http::header::CONNECTION) {
        for token in v.as_bytes().split(|b| *b == b',') {
            let token = token.trim_ascii();
            if token.eq_ignore_ascii_case(b"close") {
                return false;
            }
            if token.eq_ignore_ascii_case(b"keep-alive") {
                said = Some(true);
            }
        }
    }
    said.unwrap_or(header.version == http::Version::HTTP_11)
}

/// A chunk-size line's size: hex digits (at most 16), then optional white space and
/// extensions, which are ignored.
fn chunk_size(line: &[u8]) -> pingora_error::Result<u64> {
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let after = &line[digits..];
    let rest_ok = after.is_empty() || matches!(after[0], b';' | b' ' | b'\t');
    if digits == 0 || digits > 16 || !rest_ok {
        return Error::e_explain(INVALID_CHUNK, "a chunk size is not a hex number");
    }
    let text = std::str::from_utf8(&line[..digits]).unwrap_or_default();
    u64::from_str_radix(text, 16)
        .or_else(|_| Error::e_explain(INVALID_CHUNK, "a chunk size is not a hex number"))
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
