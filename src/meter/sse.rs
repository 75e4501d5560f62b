//! Streamed replies, metered as they pass. The meter is fed each piece of the body (events
//! split at any byte, several per piece) and keeps only what is unfinished. Three dialects:
//! OpenAI chat and completions (`usage` on an event of its own or on the last one), the
//! Responses API (`usage` in `response.completed`, `.incomplete` or `.failed`) and Anthropic's
//! Messages (`message_start` then cumulative counts in `message_delta`).
//! - Observe mode: the bytes go on unchanged; only the unfinished line is kept.
//! - Strip mode (chat only: the gateway asked the upstream for `include_usage` on the
//!   client's behalf): whole events are held until complete and what the request for usage
//!   added is taken out again, in every shape real servers use: a `usage` member is removed
//!   (`null` on every event, or the counts on the last content event), and an event is
//!   dropped only when nothing else is left in it (`choices` empty, or one choice with an
//!   empty delta and no finish reason). The client sees what it would have seen without the
//!   gateway.
//! - A chat or completions stream the upstream ended whole without `data: [DONE]` gets it
//!   (the API's terminator, which clients wait for); a stream cut short never does.

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem::{Finder, FinderRev};
use serde::Deserialize;

use super::{RawUsage, Usage};

/// Which API's events the stream carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dialect {
    #[default]
    Chat,
    Responses,
    Messages,
}

/// The keys looked for in every event, each searcher built once: `memmem::find` builds one
/// on each call, which cost more than the search itself in an event of a hundred bytes (about
/// 3 µs of a 20-event stream's CPU).
macro_rules! needles {
    ($($name:ident: $kind:ident = $bytes:literal;)*) => {
        $(static $name: LazyLock<$kind<'static>> = LazyLock::new(|| $kind::new($bytes));)*
    };
}

needles! {
    USAGE: Finder = b"\"usage\"";
    CONTENT: Finder = b"\"content\"";
    TEXT: Finder = b"\"text\"";
    DELTA: Finder = b"\"delta\"";
    PARTIAL_JSON: Finder = b"\"partial_json\"";
    THINKING: Finder = b"\"thinking\"";
    TOOL_CALLS: Finder = b"\"tool_calls\"";
    ARGUMENTS: Finder = b"\"arguments\"";
    NAME: Finder = b"\"name\"";
    // Either of the two below.
    REASONING_ANY: Finder = b"\"reasoning";
    REASONING_CONTENT: Finder = b"\"reasoning_content\"";
    REASONING: Finder = b"\"reasoning\"";
    RESPONSE_CREATED: Finder = b"\"response.created\"";
    // An event's end (its blank line), searched from the back.
    BLANK_LF: FinderRev = b"\n\n";
    BLANK_CRLF: FinderRev = b"\r\n\r\n";
}

/// A member's value: the bytes after its key (`rest`), past the colon and white space.
fn value_of(rest: &[u8]) -> Option<&[u8]> {
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
fn has_value(data: &[u8], key: &Finder<'_>, test: impl Fn(&[u8]) -> bool) -> bool {
    let len = key.needle().len();
    key.find_iter(data)
        .any(|at| value_of(&data[at + len..]).is_some_and(&test))
}

/// The JSON string literals (quotes and escapes as they came) of a content event's output
/// text, in the order the text reads: what the tokenizer fallback counts, kept without the
/// event around them (an OpenAI chunk's id, object, time, model and fingerprint are most of
/// its bytes, and a long stream kept them for every token). Chat: a reasoning model's
/// reasoning, the content (or a completion's `text`), a tool call's name and arguments;
/// Responses: the `delta` strings; Messages: a delta's text, tool input and thinking.
fn push_text_literals(dialect: Dialect, data: &[u8], mut push: impl FnMut(&[u8])) {
    let mut each = |key: &Finder<'_>| {
        let len = key.needle().len();
        for at in key.find_iter(data) {
            if let Some(literal) = value_of(&data[at + len..]).and_then(string_literal) {
                push(literal);
            }
        }
    };
    match dialect {
        Dialect::Chat => {
            if REASONING_ANY.find(data).is_some() {
                each(&REASONING_CONTENT);
                each(&REASONING);
            }
            each(&CONTENT);
            each(&TEXT);
            if TOOL_CALLS.find(data).is_some() {
                each(&NAME);
                each(&ARGUMENTS);
            }
        }
        Dialect::Responses => each(&DELTA),
        Dialect::Messages => {
            each(&TEXT);
            each(&PARTIAL_JSON);
            each(&THINKING);
        }
    }
}

/// A non-empty JSON string literal at the start of `value`, quotes included.
fn string_literal(value: &[u8]) -> Option<&[u8]> {
    if value.len() < 3 || value[0] != b'"' || value[1] == b'"' {
        return None;
    }
    let mut i = 1;
    loop {
        let j = i + memchr::memchr2(b'"', b'\\', value.get(i..)?)?;
        if value[j] == b'"' {
            return Some(&value[..=j]);
        }
        // An escape: the byte after the backslash is part of it.
        i = j + 2;
    }
}

/// Longest line or event held while waiting for its end; past it the bytes are passed on
/// unmetered, so a misbehaving upstream cannot grow memory without bound.
const MAX_HELD: usize = 1024 * 1024;
/// Most output text kept for the tokenizer fallback.
const MAX_TEXT: usize = 4 * 1024 * 1024;

#[derive(Debug, Default)]
pub struct SseMeter {
    dialect: Dialect,
    strip_usage: bool,
    /// Observe mode: the unfinished line. Strip mode: the unfinished event.
    held: Vec<u8>,
    skipping: bool,
    pub usage: Option<Usage>,
    /// Messages: the usage parts so far (`message_start`'s, then each `message_delta`'s).
    parts: Option<RawUsage>,
    /// Responses: the id the upstream gave the response (`response.created`).
    pub response_id: Option<String>,
    pub events: u64,
    pub done: bool,
    pub saw_content: bool,
    /// The output text's JSON string literals, as they came, one a line (decoded only for an
    /// estimate: `push_text_literals`).
    raw_content: Vec<u8>,
    /// The last bytes sent on, to end the stream on an event boundary before a `[DONE]`
    /// of the gateway's.
    tail: [u8; 4],
    /// No `[DONE]` of the gateway's: the upstream's end cannot be told from a cut (a body
    /// ended by a close), or the reply keeps the upstream's length (no byte may be added).
    no_terminator: bool,
    /// Metered only from the usage its events report, never estimated (a stream of an
    /// endpoint the gateway does not know: its text may not be what is billed).
    pub reported_only: bool,
}

/// A chat or completions event that carries usage.
#[derive(Deserialize)]
struct UsageEvent {
    #[serde(default)]
    choices: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    #[serde(default)]
    usage: Option<RawUsage>,
}

/// Whether a choice says nothing beyond its index: what a server adds to carry usage.
fn empty_choice(choice: &serde_json::Map<String, serde_json::Value>) -> bool {
    use serde_json::Value;
    let blank = |v: &Value| match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    };
    choice.iter().all(|(k, v)| match k.as_str() {
        "index" => true,
        "delta" => match v {
            Value::Object(d) => d.iter().all(|(k, v)| k == "role" || blank(v)),
            other => blank(other),
        },
        _ => blank(v),
    })
}

/// A Responses event whose `response` carries usage (or, when created, its id).
#[derive(Deserialize)]
struct ResponsesEvent {
    #[serde(default)]
    response: Option<ResponseObject>,
}

#[derive(Deserialize)]
struct ResponseObject {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    usage: Option<RawUsage>,
}

/// A Messages event with usage: `message_start` (in `message`) or `message_delta`.
#[derive(Deserialize)]
struct MessagesEvent {
    #[serde(default)]
    message: Option<MessageObject>,
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
struct MessageObject {
    #[serde(default)]
    usage: Option<RawUsage>,
}

impl SseMeter {
    /// A chat or completions stream; `strip_usage`: the gateway asked for the usage.
    pub fn new(strip_usage: bool) -> SseMeter {
        SseMeter {
            strip_usage,
            ..SseMeter::default()
        }
    }

    /// The reply's end may not get a `[DONE]` of the gateway's (see `no_terminator`).
    pub fn keep_unterminated(&mut self) {
        self.no_terminator = true;
    }

    /// A stream of an endpoint the gateway does not know (`other`): passed on as it came (no
    /// `[DONE]` of the gateway's), metered from the usage its events report, never estimated.
    pub fn reported() -> SseMeter {
        SseMeter {
            no_terminator: true,
            reported_only: true,
            ..SseMeter::default()
        }
    }

    /// A Responses or Messages stream (their usage is always sent: nothing to strip).
    pub fn of(dialect: Dialect) -> SseMeter {
        SseMeter {
            dialect,
            ..SseMeter::default()
        }
    }

    /// Messages: the prompt tokens `message_start` reported, for a stream cut before its
    /// final counts.
    pub fn prompt_reported(&self) -> Option<u64> {
        self.parts
            .filter(RawUsage::has_prompt)
            .and_then(RawUsage::counts)
            .map(|u| u.prompt_tokens)
    }

    pub fn strips_usage(&self) -> bool {
        self.strip_usage
    }

    /// Feeds one piece. Returns the bytes to send on in its place: the piece itself in
    /// observe mode, the completed (and edited) events in strip mode; at the end of a chat
    /// stream that had no `[DONE]`, with one after them.
    pub fn feed(&mut self, piece: Bytes, end: bool) -> Bytes {
        let out = self.pass(piece, end);
        if !end
            || self.dialect != Dialect::Chat
            || self.done
            || self.events == 0
            || self.no_terminator
        {
            self.note_tail(&out);
            return out;
        }
        self.done = true;
        let mut with = Vec::with_capacity(out.len() + 16);
        with.extend_from_slice(&out);
        self.note_tail(&out);
        let tail = self.tail;
        if !(tail.ends_with(b"\n\n") || tail == *b"\r\n\r\n") {
            with.extend_from_slice(if tail.ends_with(b"\n") {
                b"\n"
            } else {
                b"\n\n"
            });
        }
        with.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(with)
    }

    fn note_tail(&mut self, out: &[u8]) {
        if out.len() >= 4 {
            self.tail.copy_from_slice(&out[out.len() - 4..]);
        } else {
            for &b in out {
                self.tail.rotate_left(1);
                self.tail[3] = b;
            }
        }
    }

    fn pass(&mut self, piece: Bytes, end: bool) -> Bytes {
        if !self.strip_usage {
            self.observe(&piece);
            // The last line of a stream that ends without a newline is a line all the same.
            if end && !self.held.is_empty() && !self.skipping {
                let last = std::mem::take(&mut self.held);
                self.line(&last);
            }
            return piece;
        }
        let ready = if self.held.is_empty() {
            // The usual case: the piece begins an event, so its complete events can go on as
            // its own bytes, and only an unfinished one is held.
            let cut = if end {
                piece.len()
            } else {
                last_event_end(&piece)
            };
            if cut == 0 && piece.len() > MAX_HELD {
                // Not SSE as we know it: give up editing and pass everything on.
                self.strip_usage = false;
                return piece;
            }
            self.held.extend_from_slice(&piece[cut..]);
            piece.slice(..cut)
        } else {
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
                    self.strip_usage = false;
                    let all = std::mem::take(&mut self.held);
                    return Bytes::from(all);
                }
                return Bytes::new();
            }
            let rest = self.held.split_off(cut);
            Bytes::from(std::mem::replace(&mut self.held, rest))
        };
        self.edit(ready)
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
        // One scan for `"usage"`: whether the event names it at all, and whether one holds counts.
        let mut names_usage = false;
        let reported = USAGE.find_iter(data).any(|at| {
            names_usage = true;
            value_of(&data[at + USAGE.needle().len()..]).is_some_and(|v| !v.starts_with(b"null"))
        });
        let mut kind = if names_usage {
            Kind::NamesUsage
        } else {
            Kind::Data
        };
        if reported {
            kind = self.usage_event(data);
        } else if self.dialect == Dialect::Responses
            && self.response_id.is_none()
            && RESPONSE_CREATED.find(data).is_some()
        {
            self.response_id = serde_json::from_slice::<ResponsesEvent>(data)
                .ok()
                .and_then(|e| e.response?.id);
        }
        let text = |v: &[u8]| v.len() > 1 && v[0] == b'"' && v[1] != b'"';
        // Chat output other than content (a tool call's name and arguments, a reasoning
        // model's reasoning) is looked for only in an event without content, and each only
        // where its member's name is there at all (two scans for a role or finish event).
        let content = has_value(data, &CONTENT, text)
            || has_value(data, &TEXT, text)
            || (self.dialect != Dialect::Chat && has_value(data, &DELTA, text))
            || (self.dialect == Dialect::Messages
                && (has_value(data, &PARTIAL_JSON, text) || has_value(data, &THINKING, text)))
            || (self.dialect == Dialect::Chat
                && ((TOOL_CALLS.find(data).is_some()
                    && (has_value(data, &ARGUMENTS, text) || has_value(data, &NAME, text)))
                    || (REASONING_ANY.find(data).is_some()
                        && (has_value(data, &REASONING_CONTENT, text)
                            || has_value(data, &REASONING, text)))));
        if content {
            self.saw_content = true;
            // Kept for an estimate, which a stream metered only from its reported usage never
            // makes.
            if !self.reported_only {
                let kept = &mut self.raw_content;
                push_text_literals(self.dialect, data, |literal| {
                    if kept.len() + literal.len() < MAX_TEXT {
                        kept.extend_from_slice(literal);
                        kept.push(b'\n');
                    }
                });
            }
        }
        kind
    }

    /// Reads the usage of an event that has a non-null one; for chat, says whether the event
    /// carries anything else.
    fn usage_event(&mut self, data: &[u8]) -> Kind {
        match self.dialect {
            Dialect::Chat => {
                let Ok(ev) = serde_json::from_slice::<UsageEvent>(data) else {
                    return Kind::NamesUsage;
                };
                let Some(u) = ev.usage else {
                    return Kind::NamesUsage;
                };
                // An event the gateway's `include_usage` added is still taken out when its
                // counts are not believed; the stream is then estimated.
                self.usage = u.counts();
                if ev.choices.iter().flatten().all(empty_choice) {
                    Kind::UsageOnly
                } else {
                    Kind::UsageWith
                }
            }
            Dialect::Responses => {
                if let Ok(ResponsesEvent {
                    response: Some(r), ..
                }) = serde_json::from_slice(data)
                {
                    if let Some(u) = r.usage {
                        self.usage = u.counts();
                    }
                    if self.response_id.is_none() {
                        self.response_id = r.id;
                    }
                }
                Kind::NamesUsage
            }
            Dialect::Messages => {
                if let Ok(ev) = serde_json::from_slice::<MessagesEvent>(data) {
                    if let Some(start) = ev.message.and_then(|m| m.usage) {
                        self.parts = Some(start);
                    }
                    // Only `message_delta` has the final output count: until it comes the
                    // stream is not fully reported.
                    if let Some(delta) = ev.usage {
                        let mut parts = self.parts.unwrap_or_default();
                        parts.merge(delta);
                        self.parts = Some(parts);
                        self.usage = parts.counts();
                    }
                }
                Kind::NamesUsage
            }
        }
    }

    /// The output text seen so far (for estimating when the upstream reports no usage).
    pub fn text(&self) -> String {
        let mut text = String::new();
        for literal in self.raw_content.split(|b| *b == b'\n') {
            if let Ok(piece) = serde_json::from_slice::<Cow<'_, str>>(literal) {
                text.push_str(&piece);
            }
        }
        text
    }

    /// The complete events in `ready`, metered and edited. When no event changes (a stream's
    /// content events carry no `usage` member), the bytes go on as they came, not copied;
    /// otherwise the events are written anew around the edited ones.
    fn edit(&mut self, ready: Bytes) -> Bytes {
        let mut out: Option<Vec<u8>> = None;
        // `ready[..copied]` is in `out` already (or, while `out` is None, needs no edit).
        let mut copied = 0;
        let mut start = 0;
        while start < ready.len() {
            let end = event_end(&ready, start);
            if let Some(edited) = self.edit_event(&ready[start..end]) {
                let out = out.get_or_insert_with(|| Vec::with_capacity(ready.len()));
                out.extend_from_slice(&ready[copied..start]);
                out.extend_from_slice(&edited);
                copied = end;
            }
            start = end;
        }
        match out {
            None => ready,
            Some(mut out) => {
                out.extend_from_slice(&ready[copied..]);
                Bytes::from(out)
            }
        }
    }

    /// Meters one event's lines; returns what replaces it if it changes (empty: dropped), or
    /// None to keep it as it came.
    fn edit_event(&mut self, event: &[u8]) -> Option<Vec<u8>> {
        let mut kept: Option<Vec<u8>> = None;
        let mut drop_event = false;
        let mut at = 0;
        while at < event.len() {
            // Lines found with memchr (a byte-at-a-time split was a tenth of a stream's meter).
            let end = memchr::memchr(b'\n', &event[at..]).map_or(event.len(), |i| at + i + 1);
            let line = &event[at..end];
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            let kind = self.line(body);
            let edited = match kind {
                Kind::UsageOnly => {
                    drop_event = true;
                    None
                }
                Kind::NamesUsage => strip_usage_member(body, true),
                Kind::UsageWith => strip_usage_member(body, false),
                Kind::Data | Kind::Done | Kind::Other => None,
            };
            match edited {
                Some(edited) => {
                    let kept = kept.get_or_insert_with(|| {
                        let mut v = Vec::with_capacity(event.len());
                        v.extend_from_slice(&event[..at]);
                        v
                    });
                    kept.extend_from_slice(&edited);
                    kept.extend_from_slice(&line[body.len()..]);
                }
                None => {
                    if let Some(kept) = kept.as_mut() {
                        kept.extend_from_slice(line);
                    }
                }
            }
            at = end;
        }
        if drop_event {
            return Some(Vec::new());
        }
        kept
    }
}

enum Kind {
    /// An event that does not name `usage`: nothing to take out.
    Data,
    /// An event that names `usage` without counts in it (`"usage":null` is taken out).
    NamesUsage,
    /// Usage and nothing else (the event the request for usage added).
    UsageOnly,
    /// Usage on an event that also carries content or a finish reason.
    UsageWith,
    Done,
    Other,
}

/// End (exclusive) of the last complete event: just after its blank line. 0 if none.
fn last_event_end(buf: &[u8]) -> usize {
    // A piece usually ends where an event does.
    if buf.ends_with(b"\n\n") || buf.ends_with(b"\r\n\r\n") {
        return buf.len();
    }
    let lf = BLANK_LF.rfind(buf).map_or(0, |i| i + 2);
    // A later `\r\n\r\n` can only be after the last `\n\n`.
    let crlf = BLANK_CRLF.rfind(&buf[lf..]).map_or(0, |i| lf + i + 4);
    lf.max(crlf)
}

/// The end (exclusive) of the event that begins at `start`: just after its blank line (`\n\n`
/// or `\r\n\r\n`), or the end of `buf` if it has none.
fn event_end(buf: &[u8], start: usize) -> usize {
    for i in memchr::memchr_iter(b'\n', &buf[start..]).map(|i| start + i) {
        match buf.get(i + 1) {
            Some(b'\n') => return i + 2,
            Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => return i + 3,
            _ => {}
        }
    }
    buf.len()
}

/// Where the top-level `"usage"` member of a JSON object is: (key start, value end); with
/// `only_null`, only a `null` one. A string-aware scan: quotes inside strings are escaped, so
/// a key can only start at an unescaped quote, and depth tells top-level members from nested
/// ones. A non-null value's end is found by the JSON parser.
fn top_level_usage(json: &[u8], only_null: bool) -> Option<(usize, usize)> {
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
                        let value = &rest[v..];
                        if value.starts_with(b"null") {
                            return Some((start, i + 1 + v + 4));
                        }
                        if !only_null {
                            let mut values = serde_json::Deserializer::from_slice(value)
                                .into_iter::<serde::de::IgnoredAny>();
                            values.next()?.ok()?;
                            return Some((start, i + 1 + v + values.byte_offset()));
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

/// A `data: {...}` line without its top-level `"usage"` member (with `only_null`, only a
/// `"usage":null` one), or None if it has none.
fn strip_usage_member(line: &[u8], only_null: bool) -> Option<Vec<u8>> {
    USAGE.find(line)?;
    let json_start = line.iter().position(|b| *b == b'{')?;
    let json = &line[json_start..];
    let (key_start, v_end) =
        last_member_null_usage(json).or_else(|| top_level_usage(json, only_null))?;
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
        let event =
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}";
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
}
