//! The stream meters (chat with and without usage stripping, Responses, Messages) on any
//! bytes cut into pieces anywhere: never a panic; observe mode passes every byte on; strip mode
//! gives the same bytes whatever the cuts.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use modelgate::meter::sse::{Dialect, SseMeter};

fn meter(mode: u8) -> SseMeter {
    match mode % 4 {
        0 => SseMeter::new(false),
        1 => SseMeter::new(true),
        2 => SseMeter::of(Dialect::Responses),
        _ => SseMeter::of(Dialect::Messages),
    }
}

/// Feeds `input` in pieces of the sizes `sizes` gives in turn (1..=64 bytes).
fn run(mode: u8, input: &[u8], sizes: &[u8]) -> Vec<u8> {
    let mut m = meter(mode);
    let mut out = Vec::new();
    let (mut at, mut i) = (0, 0);
    while at < input.len() {
        let size = sizes
            .get(i % sizes.len().max(1))
            .map_or(7, |s| usize::from(s % 64) + 1);
        let end = (at + size).min(input.len());
        out.extend_from_slice(&m.feed(Bytes::copy_from_slice(&input[at..end]), end == input.len()));
        at = end;
        i += 1;
    }
    let _ = m.text();
    let _ = m.prompt_reported();
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let split = rest.len().min(16);
    let (sizes, input) = rest.split_at(split);
    let out = run(mode, input, sizes);
    if mode % 4 != 1 {
        assert_eq!(out, input, "observe mode changed the stream");
    } else {
        let whole = run(mode, input, &[255]);
        let bytewise = run(mode, input, &[0]);
        assert_eq!(out, whole, "strip mode depends on the cuts");
        assert_eq!(out, bytewise, "strip mode depends on the cuts");
    }
});
