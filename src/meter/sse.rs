//! Streamed replies, metered as they pass. The meter is fed each piece of the body (events
//! split at any byte, several per piece) and keeps only what is unfinished.
//! - Observe mode: the bytes go on unchanged; only the unfinished line is kept.
//! - Strip mode (the gateway asked the upstream for `include_usage` on the client's behalf):
//!   whole events are held until complete, the usage-only event is dropped and the
//!   `"usage":null` member the upstream adds to every other event is removed, so the client
//!   sees what it would have seen without the gateway.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;

use super::Usage;

/// The bytes after `key` and its colon, at the first place `key` appears as a key.
fn value_after<'a>(data: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let at = memchr::memmem::find(data, key)? + key.len();
    let rest = &data[at..];
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[colon] != b':' {
        return None;
    }
    let v = colon
        + 1
        + rest[colon + 1..]
            .iter()
            .position(|b| !b.is_ascii_whitespace())?;
    Some(&rest[v..])
}

/// Whether some occurrence of `key` in the event has a value for which `test` holds, checked
/// on the bytes. Inside a JSON string a quote is escaped, so a match is a real key.
fn has_value(data: &[u8], key: &[u8], test: impl Fn(&[u8]) -> bool) -> bool {
    let mut from = 0;
    while let Some(i) = memchr::memmem::find(&data[from..], key) {
        let at = from + i;
        if value_after(&data[at..], key).is_some_and(&test) {
            return true;
        }
        from = at + key.len();
    }
    false
}

/// Longest line or event held while waiting for its end; past it the bytes are passed on
/// unmetered, so a misbehaving upstream cannot grow memory without bound.
const MAX_HELD: usize = 1024 * 1024;
/// Most output text kept for the tokenizer fallback.
const MAX_TEXT: usize = 4 * 1024 * 1024;

#[derive(Debug, Default)]
pub struct SseMeter {
    strip_usage: bool,
    /// Observe mode: the unfinished line. Strip mode: the unfinished event.
    held: Vec<u8>,
    skipping: bool,
    pub usage: Option<Usage>,
    pub events: u64,
    pub done: bool,
    pub saw_content: bool,
    /// Content events seen, raw and newline-separated (parsed only for an estimate).
    raw_content: Vec<u8>,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
}

impl SseMeter {
    pub fn new(strip_usage: bool) -> SseMeter {
        SseMeter {
            strip_usage,
            ..SseMeter::default()
        }
    }

    pub fn strips_usage(&self) -> bool {
        self.strip_usage
    }

    /// Feeds one piece. Returns the bytes to send on in its place: the piece itself in
    /// observe mode, the completed (and edited) events in strip mode.
    pub fn feed(&mut self, piece: Bytes, end: bool) -> Bytes {
        if !self.strip_usage {
            self.observe(&piece);
            return piece;
        }
        // What was held had no complete event, so an event end must touch the new bytes:
        // search only from just before them (a terminator may straddle the seam).
        let from = self.held.len().saturating_sub(3);
        self.held.extend_from_slice(&piece);
        let cut = if end {
            self.held.len()
        } else {
            match last_event_end(&self.held[from..]) {
                0 => 0,
                n => from + n,
            }
        };
        if cut == 0 {
            if self.held.len() > MAX_HELD {
                // Not SSE as we know it: give up editing and pass everything on.
                self.strip_usage = false;
                let all = std::mem::take(&mut self.held);
                return Bytes::from(all);
            }
            return Bytes::new();
        }
        let ready: Vec<u8> = self.held.drain(..cut).collect();
        let mut out = Vec::with_capacity(ready.len());
        for event in split_events(&ready) {
            self.edit_event(event, &mut out);
        }
        Bytes::from(out)
    }

    fn observe(&mut self, piece: &[u8]) {
        let mut rest = piece;
        while let Some(nl) = memchr::memchr(b'\n', rest) {
            let (line, after) = rest.split_at(nl);
            rest = &after[1..];
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if self.held.is_empty() {
                self.line(line);
            } else {
                let mut whole = std::mem::take(&mut self.held);
                whole.extend_from_slice(line);
                self.line(&whole);
            }
        }
        if !self.skipping {
            self.held.extend_from_slice(rest);
            if self.held.len() > MAX_HELD {
                self.held = Vec::new();
                self.skipping = true;
            }
        }
    }

    /// Meters one line; returns what kind of event its data is.
    /// Meters one line; returns what kind of event its data is. Cheap byte checks on the
    /// common path: only an event with a non-null `usage` is parsed, and content events are
    /// kept raw (bounded) for the tokenizer fallback, parsed only if no usage ever comes.
    fn line(&mut self, line: &[u8]) -> Kind {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return Kind::Other;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        self.events += 1;
        if data == b"[DONE]" {
            self.done = true;
            return Kind::Done;
        }
        let mut kind = Kind::Data;
        if has_value(data, b"\"usage\"", |v| !v.starts_with(b"null")) {
            if let Ok(ev) = serde_json::from_slice::<Event>(data) {
                if let Some(u) = ev.usage {
                    self.usage = Some(u);
                    if ev.choices.as_ref().is_none_or(Vec::is_empty) {
                        kind = Kind::UsageOnly;
                    }
                }
            }
        }
        let text = |v: &[u8]| v.len() > 1 && v[0] == b'"' && v[1] != b'"';
        if has_value(data, b"\"content\"", text) || has_value(data, b"\"text\"", text) {
            self.saw_content = true;
            if self.raw_content.len() + data.len() < MAX_TEXT {
                self.raw_content.extend_from_slice(data);
                self.raw_content.push(b'\n');
            }
        }
        kind
    }

    /// The output text seen so far (for estimating when the upstream reports no usage).
    pub fn text(&self) -> String {
        let mut text = String::new();
        for data in self
            .raw_content
            .split(|b| *b == b'\n')
            .filter(|d| !d.is_empty())
        {
            let Ok(ev) = serde_json::from_slice::<Event>(data) else {
                continue;
            };
            for c in ev.choices.iter().flatten() {
                let piece = c
                    .delta
                    .as_ref()
                    .and_then(|d| d.content.as_deref())
                    .or(c.text.as_deref());
                text.push_str(piece.unwrap_or(""));
            }
        }
        text
    }

    fn edit_event(&mut self, event: &[u8], out: &mut Vec<u8>) {
        let mut kept = Vec::with_capacity(event.len());
        let mut drop_event = false;
        for line in event.split_inclusive(|b| *b == b'\n') {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            match self.line(body) {
                Kind::UsageOnly => drop_event = true,
                Kind::Data => match strip_usage_member(body) {
                    Some(edited) => {
                        kept.extend_from_slice(&edited);
                        kept.extend_from_slice(&line[body.len()..]);
                    }
                    None => kept.extend_from_slice(line),
                },
                Kind::Done | Kind::Other => kept.extend_from_slice(line),
            }
        }
        if !drop_event {
            out.extend_from_slice(&kept);
        }
    }
}

enum Kind {
    Data,
    UsageOnly,
    Done,
    Other,
}

/// End (exclusive) of the last complete event: just after its blank line. 0 if none.
fn last_event_end(buf: &[u8]) -> usize {
    let lf = memchr::memmem::rfind(buf, b"\n\n").map(|i| i + 2);
    let crlf = memchr::memmem::rfind(buf, b"\r\n\r\n").map(|i| i + 4);
    lf.max(crlf).unwrap_or(0)
}

/// Complete events, each with its terminating blank line (`\n\n` or `\r\n\r\n`).
fn split_events(buf: &[u8]) -> Vec<&[u8]> {
    let mut events = Vec::new();
    let mut start = 0;
    for i in memchr::memchr_iter(b'\n', buf) {
        if i < start {
            continue;
        }
        let end = match buf.get(i + 1) {
            Some(b'\n') => i + 2,
            Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => i + 3,
            _ => continue,
        };
        events.push(&buf[start..end]);
        start = end;
    }
    if start < buf.len() {
        events.push(&buf[start..]);
    }
    events
}

/// Where the top-level `"usage": null` member of a JSON object is: (key start, value end).
/// A string-aware scan, no parse: quotes inside strings are escaped, so a key can only start
/// at an unescaped quote, and depth tells top-level members from nested ones.
fn top_level_null_usage(json: &[u8]) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let start = i;
                i += 1;
                // To the closing quote, stepping over escapes.
                loop {
                    let j = i + memchr::memchr2(b'"', b'\\', json.get(i..)?)?;
                    if json[j] == b'\\' {
                        i = j + 2;
                    } else {
                        i = j;
                        break;
                    }
                }
                if depth == 1 && &json[start..=i] == b"\"usage\"" {
                    let rest = &json[i + 1..];
                    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
                    if rest[colon] == b':' {
                        let v = colon
                            + 1
                            + rest[colon + 1..]
                                .iter()
                                .position(|b| !b.is_ascii_whitespace())?;
                        if rest[v..].starts_with(b"null") {
                            return Some((start, i + 1 + v + 4));
                        }
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The common layout, checked from the end: `"usage":null` followed only by the object's
/// closing brace. Whatever comes just before the final `}` is a member of the outer object.
fn last_member_null_usage(json: &[u8]) -> Option<(usize, usize)> {
    let end = json.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if json[end] != b'}' {
        return None;
    }
    let v_end = json[..end].iter().rposition(|b| !b.is_ascii_whitespace())? + 1;
    if !json[..v_end].ends_with(b"null") {
        return None;
    }
    let before_null = json[..v_end - 4]
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())?;
    if json[before_null] != b':' {
        return None;
    }
    let key_end = json[..before_null]
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())?
        + 1;
    // The key must be exactly `"usage"`, not the tail of an escaped string like `"x\"usage"`.
    let plain =
        json[..key_end].ends_with(b"\"usage\"") && key_end >= 8 && json[key_end - 8] != b'\\';
    plain.then_some((key_end - 7, v_end))
}

/// A `data: {...}` line without its top-level `"usage":null` member, or None if it has none.
fn strip_usage_member(line: &[u8]) -> Option<Vec<u8>> {
    memchr::memmem::find(line, b"\"usage\"")?;
    let json_start = line.iter().position(|b| *b == b'{')?;
    let json = &line[json_start..];
    let (key_start, v_end) = last_member_null_usage(json).or_else(|| top_level_null_usage(json))?;
    let prev = json[..key_start]
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())?;
    let (cut_start, cut_end) = if json[prev] == b',' {
        (prev, v_end)
    } else {
        // First member: take the comma after it instead.
        let next = v_end
            + json[v_end..]
                .iter()
                .position(|b| !b.is_ascii_whitespace())?;
        if json[next] == b',' {
            let after = next
                + 1
                + json[next + 1..]
                    .iter()
                    .position(|b| !b.is_ascii_whitespace())
                    .unwrap_or(0);
            (key_start, after)
        } else {
            (key_start, v_end)
        }
    };
    let mut out = Vec::with_capacity(line.len());
    out.extend_from_slice(&line[..json_start + cut_start]);
    out.extend_from_slice(&json[cut_end..]);
    Some(out)
}

#[cfg(test)]
mod tests {
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
            let out = strip_usage_member(line);
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
        assert_eq!(strip_usage_member(line), None);
        let quoted = br#"data: {"choices":[{"delta":{"content":"\"usage\":null"}}],"id":"a"}"#;
        assert_eq!(strip_usage_member(quoted), None);
        let spaced = br#"data: {"id": "a", "usage" : null }"#;
        assert_eq!(
            strip_usage_member(spaced).as_deref(),
            Some(&br#"data: {"id": "a" }"#[..])
        );
        let counted = br#"data: {"usage":{"total_tokens":1},"id":"a"}"#;
        assert_eq!(
            strip_usage_member(counted),
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
}
