//! The stream meters' tests: usage read from events cut anywhere, and edited events.
use super::*;

const WITH_USAGE: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"id\":\"c1\",\"usage\":null}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\u{e9} \u{2713}\"}}],\"id\":\"c1\",\"usage\":null}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"id\":\"c1\",\"usage\":null}\n\n",
    "data: {\"choices\":[],\"id\":\"c1\",\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n",
    "data: [DONE]\n\n",
);

const WITHOUT_USAGE: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"id\":\"c1\"}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\u{e9} \u{2713}\"}}],\"id\":\"c1\"}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"id\":\"c1\"}\n\n",
    "data: [DONE]\n\n",
);

fn run(input: &[u8], strip: bool, size: usize) -> (SseMeter, Vec<u8>) {
    let mut m = SseMeter::new(strip);
    let mut out = Vec::new();
    let pieces: Vec<&[u8]> = input.chunks(size).collect();
    for (i, p) in pieces.iter().enumerate() {
        out.extend_from_slice(&m.feed(Bytes::copy_from_slice(p), i + 1 == pieces.len()));
    }
    (m, out)
}

/// In strip mode, events with nothing to take out go on as the piece's own bytes (no copy),
/// an unfinished one is held, and a piece with an edit is written anew.
#[test]
fn unedited_events_are_passed_on_without_a_copy() {
    let mut m = SseMeter::new(true);
    let a = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    let piece = Bytes::from(format!("{a}{a}"));
    let out = m.feed(piece.clone(), false);
    assert_eq!(out, piece);
    assert_eq!(out.as_ptr(), piece.as_ptr());
    // A piece ending inside an event: its complete events still go on uncopied.
    let piece = Bytes::from(format!("{a}data: {{\"cho"));
    let out = m.feed(piece.clone(), false);
    assert_eq!(out, a.as_bytes());
    assert_eq!(out.as_ptr(), piece.as_ptr());
    // The held rest, completed, and an event whose null usage is taken out.
    let nulled = "data: {\"choices\":[],\"usage\":null}\n\n";
    let out = m.feed(Bytes::from(format!("ices\":[]}}\n\n{nulled}{a}")), false);
    assert_eq!(
        out,
        format!("data: {{\"choices\":[]}}\n\ndata: {{\"choices\":[]}}\n\n{a}").as_bytes()
    );
    assert_eq!(m.events, 6);
}

#[test]
fn a_whole_chat_stream_without_done_gets_it_on_an_event_boundary_and_a_cut_one_does_not() {
    let event = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}";
    for (ending, joint) in [("\n\n", ""), ("\r\n\r\n", ""), ("\n", "\n"), ("", "\n\n")] {
        let input = format!("{event}{ending}");
        for strip in [false, true] {
            for size in [1, 3, input.len()] {
                let (m, out) = run(input.as_bytes(), strip, size);
                let out = String::from_utf8(out).expect("utf-8");
                assert_eq!(
                    out,
                    format!("{input}{joint}data: [DONE]\n\n"),
                    "{ending:?} {size}"
                );
                assert!(m.done);
            }
        }
    }
    // Not ended (the upstream cut it): the feed never says `end`, no terminator.
    let mut m = SseMeter::new(false);
    let out = m.feed(Bytes::from(format!("{event}\n\n")), false);
    assert!(!String::from_utf8_lossy(&out).contains("[DONE]"));
    // Not a stream of events at all (a JSON reply to a stream request): left alone.
    let (_, out) = run(b"{\"error\":\"x\"}", false, 4);
    assert_eq!(out, b"{\"error\":\"x\"}");
    // Other dialects have their own ends.
    let mut m = SseMeter::of(Dialect::Responses);
    let out = m.feed(Bytes::from(format!("{event}\n\n")), true);
    assert!(!String::from_utf8_lossy(&out).contains("[DONE]"));
}

#[test]
fn only_the_text_values_of_content_events_are_kept_for_the_estimate() {
    let chunk = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,",
        "\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_1\",",
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi \\\"there\\\"\\\\\"}}],",
        "\"obfuscation\":\"x\"}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\",",
        "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n",
        // A logprobs `content` is not a string: not text.
        "data: {\"choices\":[{\"delta\":{\"content\":\"!\"},\"logprobs\":{\"content\":[]}}]}\n\n",
        "data: [DONE]\n\n",
    );
    let (m, out) = run(chunk.as_bytes(), false, chunk.len());
    assert_eq!(out, chunk.as_bytes());
    assert_eq!(m.text(), "Hi \"there\"\\hmf{}!");
    let kept = String::from_utf8_lossy(&m.raw_content).into_owned();
    assert_eq!(
        kept,
        "\"Hi \\\"there\\\"\\\\\"\n\"hm\"\n\"f\"\n\"{}\"\n\"!\"\n"
    );
}

#[test]
fn a_string_literal_ends_at_its_unescaped_quote() {
    assert_eq!(string_literal(b"\"a\\\"b\" ,"), Some(&b"\"a\\\"b\""[..]));
    assert_eq!(string_literal(b"\"a\\\\\",\"x\""), Some(&b"\"a\\\\\""[..]));
    assert_eq!(string_literal(b"\"\","), None);
    assert_eq!(string_literal(b"\"unterminated\\"), None);
    assert_eq!(string_literal(b"[\"x\"]"), None);
}

#[test]
fn observe_mode_meters_at_every_piece_size_and_changes_nothing() {
    let input = WITH_USAGE.as_bytes();
    for size in 1..=input.len() {
        let (m, out) = run(input, false, size);
        assert_eq!(out, input);
        assert_eq!(m.usage.map(|u| u.total_tokens), Some(10), "size {size}");
        assert_eq!(m.text(), "caf\u{e9} \u{2713}");
        assert!(m.done && m.saw_content);
        assert_eq!(m.events, 5);
    }
}

#[test]
fn strip_mode_gives_the_client_the_stream_without_usage_at_every_piece_size() {
    let input = WITH_USAGE.as_bytes();
    for size in 1..=input.len() {
        let (m, out) = run(input, true, size);
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            WITHOUT_USAGE,
            "size {size}"
        );
        assert_eq!(m.usage.map(|u| u.prompt_tokens), Some(7));
        assert!(m.done);
    }
}

/// Usage in the shapes real servers send: (stream with the usage asked for, what the
/// client must get).
const SHAPES: [(&str, &str); 4] = [
    // The usage event has one choice with an empty delta: dropped whole.
    (
        concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":null,\"logprobs\":null}],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n",
            "data: [DONE]\n\n",
        ),
        concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        ),
    ),
    // Usage on the final content event: the member goes, the event stays.
    (
        concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n",
            "data: [DONE]\n\n",
        ),
        concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        ),
    ),
    // Usage first in the final content event, and no [DONE] (the gateway's ends it).
    (
        concat!(
            "data: {\"usage\": null, \"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"usage\": {\"prompt_tokens\":7,\"completion_tokens\":3}, \"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        ),
        concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
            "data: [DONE]\n\n",
        ),
    ),
    // `"usage": null` on every event, the usage event with `choices: []`, no [DONE].
    (
        concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"hi\"}],\"usage\": null}\n\n",
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n",
        ),
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n",
    ),
];

#[test]
fn every_usage_shape_is_stripped_at_every_piece_size() {
    for (n, (input, want)) in SHAPES.iter().enumerate() {
        for size in 1..=input.len() {
            let (m, out) = run(input.as_bytes(), true, size);
            assert_eq!(
                String::from_utf8(out).expect("utf-8"),
                *want,
                "shape {n}, size {size}"
            );
            let u = m.usage.expect("usage");
            assert_eq!((u.prompt_tokens, u.completion_tokens), (7, 3));
            assert_eq!(m.text(), "hi");
        }
        // Observe mode (the client asked for usage itself) changes nothing but the
        // terminator a stream without one gets.
        let (m, out) = run(input.as_bytes(), false, 5);
        let whole = if input.contains("[DONE]") {
            input.to_string()
        } else {
            format!("{input}data: [DONE]\n\n")
        };
        assert_eq!(String::from_utf8(out).expect("utf-8"), whole);
        assert_eq!(m.usage.map(|u| u.total_tokens), Some(10));
    }
}

/// Output that is not `content` is output too, for the estimate of a stream without usage
/// (and its time to first token): a tool call's name and arguments, a reasoning model's
/// reasoning. A field of an unexpected type spoils nothing else.
#[test]
fn tool_calls_and_reasoning_are_output() {
    let input = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Think \"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"first. \"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":{\"effort\":\"low\"},\"content\":\"Sure. \"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\": \"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    for size in [1, 7, input.len()] {
        let (m, _) = run(input.as_bytes(), true, size);
        assert_eq!(m.usage, None);
        assert!(m.saw_content);
        assert_eq!(
            m.text(),
            "Think first. Sure. get_weather{\"city\": \"Paris\"}"
        );
    }
    // A stream of tool calls alone has output from its first arguments on.
    let calls = &input[input
        .find("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls")
        .expect("tool calls")..];
    let (m, _) = run(calls.as_bytes(), true, calls.len());
    assert!(m.saw_content);
}

#[test]
fn responses_streams_are_metered_from_their_final_event() {
    let input = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hello \"}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"delta\":\"there\"}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":5,\"output_tokens\":2,\"total_tokens\":7}}}\n\n",
    );
    let cut = input.find("event: response.completed").expect("cut");
    for size in 1..=input.len() {
        let mut m = SseMeter::of(Dialect::Responses);
        for p in input.as_bytes().chunks(size) {
            assert_eq!(&m.feed(Bytes::copy_from_slice(p), false)[..], p);
        }
        let u = m.usage.expect("usage");
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.total_tokens),
            (5, 2, 7)
        );
        assert_eq!(m.response_id.as_deref(), Some("resp_1"));
        assert!(m.saw_content);
        // Cut before `response.completed`: no usage, the text so far for an estimate.
        let mut cutm = SseMeter::of(Dialect::Responses);
        for p in input.as_bytes()[..cut].chunks(size) {
            cutm.feed(Bytes::copy_from_slice(p), false);
        }
        assert_eq!(cutm.usage, None);
        assert_eq!(cutm.text(), "Hello there");
    }
}

#[test]
fn messages_streams_add_up_their_usage_parts() {
    let input = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[],\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":1,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );
    let cut = input.find("event: message_delta").expect("cut");
    for size in 1..=input.len() {
        let mut m = SseMeter::of(Dialect::Messages);
        for p in input.as_bytes().chunks(size) {
            m.feed(Bytes::copy_from_slice(p), false);
        }
        let u = m.usage.expect("usage");
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.total_tokens),
            (10, 4, 14)
        );
        let mut cutm = SseMeter::of(Dialect::Messages);
        for p in input.as_bytes()[..cut].chunks(size) {
            cutm.feed(Bytes::copy_from_slice(p), false);
        }
        assert_eq!(cutm.usage, None, "no final count: not reported");
        assert_eq!(cutm.prompt_reported(), Some(10));
        assert_eq!(cutm.text(), "Hello");
    }
}

#[test]
fn strip_mode_handles_crlf_events_and_usage_as_first_member() {
    let input = "data: {\"usage\":null, \"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n";
    let (_, out) = run(input.as_bytes(), true, 3);
    assert_eq!(
        String::from_utf8(out).expect("utf-8"),
        "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n"
    );
}

#[test]
fn malformed_events_never_panic_and_escaped_keys_are_not_cut() {
    for line in [
        &b"data: {\"usage\":1,\"x\":\"\\"[..],
        b"data: {\"x\":\"\\",
        b"data: {\"id\":\"a\",\"x\\\"usage\":null}",
        b"data: {",
        b"data: }",
    ] {
        let out = strip_usage_member(line, true);
        if line.ends_with(b"null}") {
            assert_eq!(out, None, "an escaped key is not a member");
        }
        let mut m = SseMeter::new(true);
        let mut piece = line.to_vec();
        piece.extend_from_slice(b"\n\n");
        m.feed(Bytes::from(piece), true);
    }
}

#[test]
fn a_nested_or_quoted_usage_is_not_touched() {
    let line = br#"data: {"choices":[{"delta":{"content":"x","usage":null}}]}"#;
    assert_eq!(strip_usage_member(line, true), None);
    let quoted = br#"data: {"choices":[{"delta":{"content":"\"usage\":null"}}],"id":"a"}"#;
    assert_eq!(strip_usage_member(quoted, true), None);
    let spaced = br#"data: {"id": "a", "usage" : null }"#;
    assert_eq!(
        strip_usage_member(spaced, true).as_deref(),
        Some(&br#"data: {"id": "a" }"#[..])
    );
    let counted = br#"data: {"usage":{"total_tokens":1},"id":"a"}"#;
    assert_eq!(
        strip_usage_member(counted, true),
        None,
        "only a null usage is removed"
    );
}

#[test]
fn an_overlong_line_is_passed_on_without_growing_memory() {
    let mut m = SseMeter::new(false);
    let junk = Bytes::from(vec![b'x'; 600 * 1024]);
    m.feed(Bytes::from_static(b"data: "), false);
    m.feed(junk.clone(), false);
    m.feed(junk, false);
    assert!(m.held.len() <= MAX_HELD);
    m.feed(Bytes::from_static(b"\n\ndata: [DONE]\n\n"), true);
    assert!(m.done);
    let mut s = SseMeter::new(true);
    let out = s.feed(Bytes::from(vec![b'y'; MAX_HELD + 1]), false);
    assert_eq!(
        out.len(),
        MAX_HELD + 1,
        "strip mode gives up and passes the bytes on"
    );
}

/// An event longer than the meter holds (a Responses `response.completed` with a large
/// response) passes on whole, and its usage is read from its tail.
#[test]
fn an_event_longer_than_the_meter_holds_is_metered_from_its_tail() {
    let text = "x".repeat(3 * 1024 * 1024);
    let event = format!(
        "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":\
         {{\"output_text\":\"{text}\",\"usage\":{{\"input_tokens\":5,\"output_tokens\":7,\
         \"total_tokens\":12}}}}}}\n\n"
    );
    let run = |input: &[u8], size: usize| {
        let mut m = SseMeter::of(Dialect::Responses);
        let mut out = Vec::new();
        let pieces: Vec<&[u8]> = input.chunks(size).collect();
        for (i, p) in pieces.iter().enumerate() {
            out.extend_from_slice(&m.feed(Bytes::copy_from_slice(p), i + 1 == pieces.len()));
        }
        (m, out)
    };
    for size in [4096, 1_000_000, event.len()] {
        let (m, out) = run(event.as_bytes(), size);
        assert!(
            out == event.as_bytes(),
            "{size}: {} bytes out of {}",
            out.len(),
            event.len()
        );
        let u = m.usage.expect("usage");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (5, 7), "{size}");
    }
    // Without a newline at the end, too.
    let (m, _) = run(event.trim_end().as_bytes(), 65_536);
    assert_eq!(m.usage.map(|u| u.completion_tokens), Some(7));
}
