//! Store stage, crash side: a journal line's JSON, written by hand. Each request writes two
//! (its entry, with what it sends upstream, then its record; what it sends is a line of its
//! own when the entry was written before, as the request waited) on the proxy thread that
//! serves it; `serde_json` took 0.7 µs for a record's line, a third of the journal's cost a
//! request (`cargo bench --bench store -- journal`), and this writer a fifth of that. The text is byte for byte what `serde_json`
//! writes for the same line (a property test holds the two together), so lines are read back
//! with `serde_json`, and a journal left by either reads the same.

use super::journal::{OpenedRef, SentLine, SentRef};
use super::record::RecordRef;

/// `{"open":{…}}`: what is known of a request when it passes auth.
pub fn open(out: &mut Vec<u8>, o: &OpenedRef<'_>) {
    out.extend_from_slice(b"{\"open\":{\"time_ms\":");
    int(out, o.time_ms);
    field_str(out, b",\"request_id\":", o.request_id);
    field_str(out, b",\"key_id\":", o.key_id);
    field_str(out, b",\"listener\":", o.listener);
    field_str(out, b",\"endpoint\":", o.endpoint);
    if let Some(s) = &o.sent {
        sent_fields(out, s);
    }
    out.extend_from_slice(b"}}");
}

/// `{"sent":{…}}`: what a request sent upstream, to bill its prompt if the crash ends it (an
/// entry opened before that was known).
pub(super) fn sent(out: &mut Vec<u8>, s: &SentLine<'_>) {
    out.extend_from_slice(b"{\"sent\":{\"request_id\":");
    string(out, s.request_id);
    sent_fields(out, &s.sent);
    out.extend_from_slice(b"}}");
}

/// `,"model":…,"stream":…,"prompt_tokens":…,"cost":…`
fn sent_fields(out: &mut Vec<u8>, s: &SentRef<'_>) {
    field_str(out, b",\"model\":", s.model);
    out.extend_from_slice(b",\"stream\":");
    boolean(out, s.stream);
    out.extend_from_slice(b",\"prompt_tokens\":");
    int(out, s.prompt_tokens);
    out.extend_from_slice(b",\"cost\":");
    float(out, s.cost);
}

/// `{"close":{…}}`: the request's whole record, its fields in the struct's order.
pub fn close(out: &mut Vec<u8>, r: &RecordRef<'_>) {
    out.extend_from_slice(b"{\"close\":{\"time_ms\":");
    int(out, r.time_ms);
    field_str(out, b",\"request_id\":", r.request_id);
    field_str(out, b",\"key_id\":", r.key_id);
    field_str(out, b",\"listener\":", r.listener);
    field_str(out, b",\"endpoint\":", r.endpoint);
    field_str(out, b",\"model\":", r.model);
    out.extend_from_slice(b",\"status\":");
    int(out, r.status);
    out.extend_from_slice(b",\"stream\":");
    boolean(out, r.stream);
    out.extend_from_slice(b",\"prompt_tokens\":");
    int(out, r.prompt_tokens);
    out.extend_from_slice(b",\"completion_tokens\":");
    int(out, r.completion_tokens);
    out.extend_from_slice(b",\"total_tokens\":");
    int(out, r.total_tokens);
    out.extend_from_slice(b",\"cost\":");
    float(out, r.cost);
    out.extend_from_slice(b",\"latency_ms\":");
    int(out, r.latency_ms);
    out.extend_from_slice(b",\"ttft_ms\":");
    match r.ttft_ms {
        Some(ms) => int(out, ms),
        None => out.extend_from_slice(b"null"),
    }
    field_str(out, b",\"upstream\":", r.upstream);
    out.extend_from_slice(b",\"estimated\":");
    boolean(out, r.estimated);
    out.extend_from_slice(b",\"attempts\":");
    int(out, r.attempts);
    field_str(out, b",\"served_model\":", r.served_model);
    field_str(out, b",\"cut\":", r.cut);
    out.extend_from_slice(b",\"cached_prompt_tokens\":");
    int(out, r.cached_prompt_tokens);
    out.extend_from_slice(b",\"cache_write_tokens\":");
    int(out, r.cache_write_tokens);
    out.extend_from_slice(b",\"reasoning_tokens\":");
    int(out, r.reasoning_tokens);
    out.extend_from_slice(b"}}");
}

fn int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

/// As `serde_json`: the shortest text that reads back as the same number; `null` when not
/// finite.
fn float(out: &mut Vec<u8>, f: f64) {
    if f.is_finite() {
        out.extend_from_slice(zmij::Buffer::new().format_finite(f).as_bytes());
    } else {
        out.extend_from_slice(b"null");
    }
}

fn field_str(out: &mut Vec<u8>, name: &[u8], s: &str) {
    out.extend_from_slice(name);
    string(out, s);
}

/// A JSON string as `serde_json` escapes it: `"`, `\` and control characters, the common ones
/// by their short escapes; everything else as it is.
fn string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.push(b'"');
    // Most strings need no escape: one pass without an early exit (it vectorizes) finds out.
    if !bytes.iter().fold(false, |any, &b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    }) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\x08' => b'b',
            b'\x0c' => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if short == 0 {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.push(b'\\');
            out.push(short);
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::journal::LineRef;
    use super::super::record::UsageRecord;
    use super::*;

    /// Text with what JSON escapes (quotes, backslashes, every control character) among
    /// ordinary and multi-byte characters.
    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                any::<char>(),
                (0u8..0x20).prop_map(char::from),
                Just('"'),
                Just('\\'),
                Just('\u{7f}'),
                Just('\u{2028}'),
            ],
            0..24,
        )
        .prop_map(|c| c.into_iter().collect())
    }

    fn float() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            (0u64..10_000_000).prop_map(|n| n as f64 / 1e6),
            Just(0.0),
            Just(-0.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::MIN_POSITIVE),
        ]
    }

    fn record() -> impl Strategy<Value = UsageRecord> {
        (
            (any::<i64>(), text(), text(), text(), text(), text()),
            (
                any::<u16>(),
                any::<bool>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                float(),
            ),
            (
                any::<u64>(),
                any::<Option<u64>>(),
                text(),
                any::<bool>(),
                any::<u32>(),
                text(),
            ),
            (text(), any::<u64>(), any::<u64>(), any::<u64>()),
        )
            .prop_map(|(a, b, c, d)| UsageRecord {
                time_ms: a.0,
                request_id: a.1,
                key_id: a.2,
                listener: a.3,
                endpoint: a.4,
                model: a.5,
                status: b.0,
                stream: b.1,
                prompt_tokens: b.2,
                completion_tokens: b.3,
                total_tokens: b.4,
                cost: b.5,
                latency_ms: c.0,
                ttft_ms: c.1,
                upstream: c.2,
                estimated: c.3,
                attempts: c.4,
                served_model: c.5,
                cut: d.0,
                cached_prompt_tokens: d.1,
                cache_write_tokens: d.2,
                reasoning_tokens: d.3,
            })
    }

    proptest! {
        /// The hand-written line is `serde_json`'s, byte for byte (the reference: the
        /// derived `Serialize` of the same line).
        #[test]
        fn a_record_line_is_serde_jsons(r in record()) {
            let mut ours = Vec::new();
            close(&mut ours, &r.borrowed());
            let theirs = format!("{{\"close\":{}}}", serde_json::to_string(&r).expect("json"));
            prop_assert_eq!(String::from_utf8_lossy(&ours), theirs);
        }

        #[test]
        fn an_entry_line_is_serde_jsons(
            time_ms in any::<i64>(), id in text(), key in text(), listener in text(), ep in text(),
            sent in proptest::option::of((text(), any::<bool>(), any::<u64>(), float()))
        ) {
            let o = OpenedRef {
                time_ms,
                request_id: &id,
                key_id: &key,
                listener: &listener,
                endpoint: &ep,
                sent: sent.as_ref().map(|(model, stream, prompt, cost)| SentRef {
                    model,
                    stream: *stream,
                    prompt_tokens: *prompt,
                    cost: *cost,
                }),
            };
            let mut ours = Vec::new();
            open(&mut ours, &o);
            let theirs = serde_json::to_vec(&LineRef::Open(o)).expect("json");
            prop_assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&theirs));
        }

        #[test]
        fn a_sent_line_is_serde_jsons(
            id in text(), model in text(), stream in any::<bool>(), prompt in any::<u64>(),
            cost in float()
        ) {
            let s = SentLine {
                request_id: &id,
                sent: SentRef {
                    model: &model,
                    stream,
                    prompt_tokens: prompt,
                    cost,
                },
            };
            let mut ours = Vec::new();
            sent(&mut ours, &s);
            let theirs = serde_json::to_vec(&LineRef::Sent(s)).expect("json");
            prop_assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&theirs));
        }
    }
}
