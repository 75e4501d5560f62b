//! RFC 9112 section 6 (message body length), as tables, in both directions. The upstream
//! reply decoder: each row a reply, the request's method, and what the RFC says of it (the
//! body it holds and whether the connection may carry another request, or that it is no whole
//! reply), checked against the RFC oracle (fuzz/oracle/rfc9112.rs, which the fuzz targets use)
//! and against the decoder, with the reply in one read, cut in two at every byte, and one byte
//! a read. The reply writer: each row a reply's status and fields and its body's pieces, the
//! bytes written read back by the oracle. The rows are from the RFC's own rules, in its order
//! (§6.3 items 1-7), §7.1 (chunked) and §9.3 (persistence).

#[path = "../fuzz/oracle/decode.rs"]
mod decode;
#[path = "../fuzz/oracle/rfc9112.rs"]
mod rfc9112;
#[path = "../fuzz/oracle/script_io.rs"]
mod script_io;
#[path = "../fuzz/oracle/write.rs"]
mod write;

use modelgate::config::headers::PassHeaders;
use rfc9112::{Framed, Verdict};

/// (reply, HEAD, what it frames: Some((status, body, connection kept: None where the RFC leaves
/// it open)) or None for no whole reply, may the decoder refuse it)
type Row = (
    &'static str,
    bool,
    Option<(u16, &'static str, Option<bool>)>,
    bool,
);

const ROWS: &[Row] = &[
    // §6.3 (1): HEAD, 1xx, 204, 304 have no body whatever their fields say.
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
        true,
        Some((200, "", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 204 No Content\r\n\r\n",
        false,
        Some((204, "", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
        false,
        Some((304, "", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        false,
        Some((304, "", Some(true))),
        false,
    ),
    // Informational replies come before the final one and have no body.
    (
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
         HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
        false,
        Some((200, "hi", Some(true))),
        false,
    ),
    // 101 is final; the connection is the upgrade's, not HTTP's.
    (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
        false,
        Some((101, "", Some(false))),
        false,
    ),
    // (3) Transfer-Encoding, chunked last: the chunked coding frames the body.
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n",
        false,
        Some((200, "hello, world", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\ngz!\r\n0\r\n\r\n",
        false,
        Some((200, "gz!", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        false,
        Some((200, "x", Some(true))),
        false,
    ),
    // Empty list elements do not count (RFC 9110 §5.6.1): chunked is still the last coding.
    // (The first, from the h1_reply fuzz target: fuzz/corpus/h1_reply/crash-te-empty-list-element.)
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        false,
        Some((200, "ok", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nTransfer-Encoding: ,\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        false,
        Some((200, "x", Some(true))),
        false,
    ),
    // (3) chunked not last: the body runs to the close.
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello",
        false,
        Some((200, "5\r\nhello", Some(false))),
        false,
    ),
    // (3) Transfer-Encoding overrides Content-Length (a decoder may refuse the pair).
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        false,
        Some((200, "ok", None)),
        true,
    ),
    // (3) Transfer-Encoding in an HTTP/1.0 reply: framing that may be faulty, closed after
    // (§6.1), with a body or without one.
    (
        "HTTP/1.0 204 No Content\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
        false,
        Some((204, "", Some(false))),
        false,
    ),
    (
        "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        false,
        Some((200, "ok", Some(false))),
        false,
    ),
    // (5) An invalid Content-Length is an unrecoverable error; identical ones are one.
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!",
        false,
        None,
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        false,
        None,
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
        false,
        None,
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\nhello",
        false,
        None,
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
        false,
        Some((200, "hello", Some(true))),
        false,
    ),
    // (6) A length: exactly that many bytes; fewer before the close is no whole reply.
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        false,
        Some((200, "hello", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        false,
        Some((200, "", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
        false,
        None,
        false,
    ),
    // (7) Neither: the body runs to the close, and the connection ends with it.
    (
        "HTTP/1.1 200 OK\r\n\r\nto the end",
        false,
        Some((200, "to the end", Some(false))),
        false,
    ),
    // §9.3: HTTP/1.1 persists unless "close"; HTTP/1.0 only with "keep-alive".
    (
        "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        false,
        Some((200, "ok", Some(false))),
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nConnection: x-a, Close\r\nContent-Length: 2\r\n\r\nok",
        false,
        Some((200, "ok", Some(false))),
        false,
    ),
    (
        "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        false,
        Some((200, "ok", Some(false))),
        false,
    ),
    (
        "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
        false,
        Some((200, "ok", Some(true))),
        false,
    ),
    // §7.1: extensions are ignored; trailers end with an empty line; a chunk line that ends
    // in a lone LF is the decoder's leniency (§2.2 allows it for fields only).
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value;q=\"a b\"\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n",
        false,
        Some((200, "hello", Some(true))),
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n",
        false,
        Some((200, "hello", Some(true))),
        true,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
        false,
        Some((200, "0123456789", Some(true))),
        false,
    ),
    // Broken or cut chunks: no whole reply.
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        false,
        None,
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nx\r\nhello\r\n0\r\n\r\n",
        false,
        None,
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n",
        false,
        None,
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX\r\n0\r\n\r\n",
        false,
        None,
        false,
    ),
    (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n",
        false,
        None,
        false,
    ),
    // A header cut short, or no header at all.
    ("HTTP/1.1 200 OK\r\nContent-Len", false, None, false),
    ("", false, None, false),
    ("garbage\r\n\r\n", false, None, false),
];

fn expected(row: &Row) -> Verdict {
    let (reply, _, framed, may_fail) = *row;
    Verdict {
        framed: match framed {
            Some((status, body, reusable)) => Framed::Whole {
                status,
                body: body.as_bytes().to_vec(),
                reusable,
                trailing: 0,
            },
            None => rfc9112::reply(reply.as_bytes(), row.1).framed,
        },
        may_fail,
    }
}

/// The reply in one read, in two at every byte, and a byte a read.
fn splits(reply: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut all = vec![vec![reply.to_vec()]];
    for cut in 1..reply.len() {
        all.push(vec![reply[..cut].to_vec(), reply[cut..].to_vec()]);
    }
    all.push(reply.iter().map(|b| vec![*b]).collect());
    all
}

#[test]
fn the_oracle_frames_each_reply_as_the_rfc_says() {
    for row in ROWS {
        let got = rfc9112::reply(row.0.as_bytes(), row.1);
        let want = expected(row);
        match &want.framed {
            Framed::Whole { .. } => assert_eq!(got.framed, want.framed, "{:?}", row.0),
            _ => assert!(
                matches!(got.framed, Framed::Cut | Framed::Invalid),
                "{:?}: {got:?}",
                row.0
            ),
        }
        assert_eq!(got.may_fail, row.3, "{:?}", row.0);
    }
}

#[test]
fn the_upstream_decoder_frames_each_reply_as_the_rfc_says_however_it_is_read() {
    for row in ROWS {
        let want = expected(row);
        let keep = PassHeaders::parse(&["x-mock-*".to_string()]).expect("valid");
        for (pieces, keep) in splits(row.0.as_bytes())
            .into_iter()
            .flat_map(|p| [(p.clone(), None), (p, Some(&keep))])
        {
            let n = pieces.len();
            let got = decode::decode(pieces, row.1, keep);
            if let Some(d) = decode::disagreement(&want, &got, n == 1) {
                panic!("{:?} in {n} reads: {d}", row.0);
            }
            // A row the decoder may refuse is read whole by it today; say so if that changes.
            if let Framed::Whole { .. } = want.framed {
                assert!(got.is_ok(), "{:?} in {n} reads: {got:?}", row.0);
            }
        }
    }
}

/// (HEAD, status, framing fields, body pieces with their `done`)
type WriterRow = (
    bool,
    u16,
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, bool)],
);

const WRITER_ROWS: &[WriterRow] = &[
    // §6.3 (1): nothing after HEAD, 204, 304, whatever the body given.
    (true, 200, &[("content-length", "5")], &[("hello", true)]),
    (false, 204, &[], &[("ignored", true)]),
    (
        false,
        304,
        &[("transfer-encoding", "chunked")],
        &[("ignored", true)],
    ),
    // (3) chunks: pieces of any size, empty ones, an end with or without a last piece.
    (
        false,
        200,
        &[("transfer-encoding", "chunked")],
        &[("hello", false), ("", false), (", world", true)],
    ),
    (
        false,
        200,
        &[("transfer-encoding", "chunked")],
        &[("data: {}\n\n", false)],
    ),
    (false, 200, &[("transfer-encoding", "chunked")], &[]),
    (
        false,
        200,
        &[
            ("transfer-encoding", "gzip, chunked"),
            ("content-length", "3"),
        ],
        &[("gz!", true)],
    ),
    // (3) not chunked last: to the close.
    (
        false,
        200,
        &[("transfer-encoding", "chunked, gzip")],
        &[("raw", true)],
    ),
    // (6) a length: no more than it, and short of it is a cut.
    (
        false,
        200,
        &[("content-length", "5")],
        &[("hel", false), ("lo and more", true)],
    ),
    (
        false,
        200,
        &[("content-length", "5"), ("content-length", "5")],
        &[("hello", true)],
    ),
    (false, 200, &[("content-length", "5")], &[("hel", true)]),
    (false, 200, &[("content-length", "0")], &[]),
    // (7) neither: to the close.
    (
        false,
        502,
        &[("content-type", "text/plain")],
        &[("upstream", false), (" gone", true)],
    ),
];

#[test]
fn the_reply_writer_frames_each_body_as_the_rfc_reads_it() {
    for (head, status, fields, pieces) in WRITER_ROWS {
        let pieces: Vec<(Vec<u8>, bool)> = pieces
            .iter()
            .map(|(p, done)| (p.as_bytes().to_vec(), *done))
            .collect();
        if let Some(d) = write::disagreement(*head, *status, fields, &pieces) {
            panic!("{status} {fields:?}: {d}");
        }
    }
}
