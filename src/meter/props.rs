//! Property tests of the stream meter: for any chat stream (any text, `usage` anywhere among
//! an event's members, LF or CRLF events) split into pieces at any bytes, the result is the
//! one of the whole stream; observe mode passes every byte on; strip mode removes the usage
//! members (and the event that carried nothing else) and changes nothing else.

use bytes::Bytes;
use proptest::prelude::*;

use super::sse::SseMeter;

/// One content event: its text and the order of its members (`usage: null` among them, or
/// not).
#[derive(Debug, Clone)]
struct Event {
    text: String,
    order: Vec<usize>,
    usage_null: bool,
}

fn event() -> impl Strategy<Value = Event> {
    (
        "(\\PC|[\"\\\\/\n\t]){0,12}",
        Just(vec![0usize, 1, 2]).prop_shuffle(),
        any::<bool>(),
    )
        .prop_map(|(text, order, usage_null)| Event {
            text,
            order,
            usage_null,
        })
}

/// An object's text from its members in the given order.
fn object(members: &[(&str, String)], order: &[usize]) -> String {
    let parts: Vec<String> = order
        .iter()
        .filter_map(|&i| members.get(i))
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// (the stream as the upstream sends it with usage asked for, what the client must get).
fn stream(
    events: &[Event],
    usage: (u64, u64),
    usage_order: &[usize],
    crlf: bool,
) -> (String, String) {
    let end = if crlf { "\r\n\r\n" } else { "\n\n" };
    let (mut with, mut without) = (String::new(), String::new());
    for e in events {
        let choices = format!(
            "[{{\"index\":0,\"delta\":{{\"content\":{}}}}}]",
            serde_json::Value::String(e.text.clone())
        );
        let full = [
            ("id", "\"c1\"".to_string()),
            ("choices", choices),
            ("usage", "null".to_string()),
        ];
        let kept: Vec<usize> = e
            .order
            .iter()
            .copied()
            .filter(|&i| i != 2 || e.usage_null)
            .collect();
        with += &format!("data: {}{end}", object(&full, &kept));
        let bare: Vec<usize> = kept.iter().copied().filter(|&i| i != 2).collect();
        without += &format!("data: {}{end}", object(&full, &bare));
    }
    let last = [
        ("id", "\"c1\"".to_string()),
        ("choices", "[]".to_string()),
        (
            "usage",
            format!(
                "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}}}",
                usage.0,
                usage.1,
                usage.0 + usage.1
            ),
        ),
    ];
    with += &format!("data: {}{end}data: [DONE]{end}", object(&last, usage_order));
    without += &format!("data: [DONE]{end}");
    (with, without)
}

/// Feeds `input` cut at `cuts` (any byte offsets); (meter, bytes passed on).
fn run(input: &[u8], strip: bool, cuts: &[usize]) -> (SseMeter, Vec<u8>) {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    at.push(0);
    at.push(input.len());
    at.sort_unstable();
    at.dedup();
    let mut m = SseMeter::new(strip);
    let mut out = Vec::new();
    for w in at.windows(2) {
        let last = w[1] == input.len();
        out.extend_from_slice(&m.feed(Bytes::copy_from_slice(&input[w[0]..w[1]]), last));
    }
    (m, out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_split_meters_the_same_and_observe_mode_changes_nothing(
        events in prop::collection::vec(event(), 0..6),
        usage in (0u64..100_000, 0u64..100_000),
        usage_order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        crlf in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let (with, _) = stream(&events, usage, &usage_order, crlf);
        let (m, out) = run(with.as_bytes(), false, &cuts);
        prop_assert_eq!(&out, with.as_bytes());
        let u = m.usage.expect("usage");
        prop_assert_eq!((u.prompt_tokens, u.completion_tokens), usage);
        let text: String = events.iter().map(|e| e.text.as_str()).collect();
        prop_assert_eq!(m.text(), text);
        prop_assert!(m.done);
    }

    #[test]
    fn any_split_strips_only_the_usage(
        events in prop::collection::vec(event(), 0..6),
        usage in (0u64..100_000, 0u64..100_000),
        usage_order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        crlf in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let (with, without) = stream(&events, usage, &usage_order, crlf);
        let (m, out) = run(with.as_bytes(), true, &cuts);
        prop_assert_eq!(String::from_utf8(out).expect("utf-8"), without);
        let u = m.usage.expect("usage");
        prop_assert_eq!((u.prompt_tokens, u.completion_tokens), usage);
        let text: String = events.iter().map(|e| e.text.as_str()).collect();
        prop_assert_eq!(m.text(), text);
    }

    #[test]
    fn any_bytes_at_any_split_never_panic_and_observe_mode_passes_them_on(
        input in prop::collection::vec(any::<u8>(), 0..600),
        cuts in prop::collection::vec(any::<usize>(), 0..20),
        strip in any::<bool>(),
    ) {
        let (m, out) = run(&input, strip, &cuts);
        if !strip {
            // Passed on as they came, but for the `[DONE]` a stream of events that ended
            // without one gets (only bytes holding a `data:` line are such a stream).
            let terminated = m.done && !input.windows(12).any(|w| w.ends_with(b"[DONE]"));
            if terminated && m.events > 0 {
                prop_assert!(out.starts_with(&input));
                prop_assert!(out.ends_with(b"data: [DONE]\n\n"));
            } else {
                prop_assert_eq!(out, input);
            }
        }
    }
}
