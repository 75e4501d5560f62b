//! The reply writer (`modelgate::http1::writer`): any reply status and framing fields, any
//! body pieces and end, written and then read back by the RFC 9112 oracle
//! (fuzz/oracle/rfc9112.rs): the framing is always valid, the body read back is exactly the
//! body written (no more than its length), and a body that ended short reads as cut.
//!
//! Input: flags (bit 0: HEAD; bits 1-3: the framing fields), a status pick, a length, then
//! pieces: a byte (bits 0-5: the piece's length, bit 7: done) and the piece's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../oracle/rfc9112.rs"]
mod rfc9112;
#[path = "../oracle/write.rs"]
mod write;

const STATUSES: [u16; 10] = [200, 201, 204, 206, 304, 400, 404, 429, 500, 502];

fuzz_target!(|data: &[u8]| {
    let [flags, status, length, rest @ ..] = data else {
        return;
    };
    let head = flags & 1 == 1;
    let status = STATUSES[usize::from(*status) % STATUSES.len()];
    let length = length.to_string();
    let fields: Vec<(&str, &str)> = match (flags >> 1) % 6 {
        0 => vec![("content-length", &length)],
        1 => vec![("transfer-encoding", "chunked")],
        2 => vec![
            ("transfer-encoding", "gzip, chunked"),
            ("content-length", &length),
        ],
        3 => vec![("content-length", &length), ("content-length", &length)],
        4 => vec![("content-type", "text/event-stream")],
        _ => vec![("transfer-encoding", "chunked, gzip")],
    };
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < rest.len() {
        let len = usize::from(rest[at] & 0x3f);
        let done = rest[at] & 0x80 != 0;
        let end = (at + 1 + len).min(rest.len());
        pieces.push((rest[at + 1..end].to_vec(), done));
        at = end;
    }
    if let Some(d) = write::disagreement(head, status, &fields, &pieces) {
        panic!("{d}");
    }
});
