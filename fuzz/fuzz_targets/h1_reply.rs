//! The upstream reply decoder (`modelgate::upstream::Conn`), differential: any bytes as an
//! upstream's reply, to a GET or a HEAD, cut into reads anywhere, are read as the RFC 9112
//! oracle (fuzz/oracle/rfc9112.rs, written from section 6 and 7.1 alone) frames them: where
//! the body ends, what it holds, whether the connection may be used again; and a reply the
//! RFC does not frame (cut short, broken) is never read as whole.
//!
//! Input: a flags byte (bit 0: HEAD; bit 1: read as forwarding reads it, keeping only the
//! fields a client may get), a byte that picks the read sizes, the reply.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../oracle/decode.rs"]
mod decode;
#[path = "../oracle/rfc9112.rs"]
mod rfc9112;
#[path = "../oracle/script_io.rs"]
mod script_io;

/// The reply cut into reads: whole when `seed` is 0, else of sizes 1 to 32 from a sequence
/// `seed` starts.
fn split(reply: &[u8], seed: u8) -> Vec<Vec<u8>> {
    if seed == 0 {
        return vec![reply.to_vec()];
    }
    let mut x = u32::from(seed);
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < reply.len() {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let size = ((x >> 16) % 32 + 1) as usize;
        let end = (at + size).min(reply.len());
        pieces.push(reply[at..end].to_vec());
        at = end;
    }
    pieces
}

fuzz_target!(|data: &[u8]| {
    let [flags, seed, reply @ ..] = data else {
        return;
    };
    let head = flags & 1 == 1;
    let keep = (flags & 2 == 2).then(|| {
        let names = ["openai-*".to_string(), "x-mock-*".to_string()];
        modelgate::config::headers::PassHeaders::parse(&names).expect("valid names")
    });
    let want = rfc9112::reply(reply, head);
    let got = decode::decode(split(reply, *seed), head, keep.as_ref());
    if let Some(d) = decode::disagreement(&want, &got, *seed == 0) {
        panic!(
            "{d}\nreply: {:?}\nhead: {head}",
            reply.escape_ascii().to_string()
        );
    }
});
