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

use super::sse_usage::strip_usage_member;
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
        $(pub(super) static $name: LazyLock<$kind<'static>> = LazyLock::new(|| $kind::new($bytes));)*
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

/// Longest line or event held while waiting for its end; past it the bytes are passed on, and
/// of a longer line only its last `LONG_TAIL` bytes are kept, where its `usage` is (a
/// Responses `response.completed` carries the whole response, then its usage): memory stays
/// bounded whatever the upstream sends.
const MAX_HELD: usize = 1024 * 1024;
/// What is kept of the end of a line longer than `MAX_HELD`.
const LONG_TAIL: usize = 64 * 1024;
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
    /// Output events (each carries at least one token) after which the stream is cut: the
    /// output its reservation holds. Events are then held whole, as in strip mode.
    cut_at: Option<u64>,
    /// Output events so far.
    pub outputs: u64,
    /// The stream was cut at `cut_at`: the client got the closing event, nothing after.
    pub cut: bool,
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

    /// Cuts the stream after `n` output events: the event past them is replaced by an error
    /// event (code `budget_exhausted`) and the end of the stream in the API's framing.
    pub fn cut_after(&mut self, n: u64) {
        self.cut_at = Some(n);
    }

    /// Whether the bytes sent on may differ from the upstream's.
    pub fn edits(&self) -> bool {
        self.strip_usage || self.cut_at.is_some()
    }

    /// What ends a stream cut by its budget, in its API's framing.
    fn closing(&self) -> Vec<u8> {
        let message = "The key's budget cannot pay for more output: the reply was cut.";
        let event = match self.dialect {
            Dialect::Chat => {
                let e = serde_json::json!({"error": {"message": message, "type": "insufficient_quota", "param": null, "code": "budget_exhausted"}});
                format!("data: {e}\n\ndata: [DONE]\n\n")
            }
            Dialect::Responses => {
                let e = serde_json::json!({"type": "error", "code": "budget_exhausted", "message": message, "param": null, "sequence_number": self.events});
                format!("event: error\ndata: {e}\n\n")
            }
            Dialect::Messages => {
                let e = serde_json::json!({"type": "error", "error": {"type": "budget_exhausted", "message": message}});
                format!("event: error\ndata: {e}\n\n")
            }
        };
        event.into_bytes()
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
        if !self.edits() {
            self.observe(&piece);
            // The last line of a stream that ends without a newline is a line all the same.
            if end && !self.held.is_empty() {
                let last = std::mem::take(&mut self.held);
                if std::mem::take(&mut self.skipping) {
                    if let Some(u) = super::usage_from_tail(&last) {
                        self.usage = Some(u);
                    }
                } else {
                    self.line(&last);
                }
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
                self.cut_at = None;
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
                    self.cut_at = None;
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
                // The end of a line too long to hold: its usage, if its tail has one.
                let mut tail = std::mem::take(&mut self.held);
                tail.extend_from_slice(line);
                if let Some(u) = super::usage_from_tail(&tail) {
                    self.usage = Some(u);
                }
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
        self.held.extend_from_slice(rest);
        if self.held.len() > MAX_HELD || (self.skipping && self.held.len() > 2 * LONG_TAIL) {
            self.held.drain(..self.held.len() - LONG_TAIL);
            self.held.shrink_to(2 * LONG_TAIL);
            self.skipping = true;
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
            self.outputs += 1;
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
        if self.cut {
            return Some(Vec::new());
        }
        let mut kept: Option<Vec<u8>> = None;
        let mut drop_event = false;
        let mut at = 0;
        while at < event.len() {
            // Lines found with memchr (a byte-at-a-time split was a tenth of a stream's meter).
            let end = memchr::memchr(b'\n', &event[at..]).map_or(event.len(), |i| at + i + 1);
            let line = &event[at..end];
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            let kind = self.line(body);
            if self.cut_at.is_some_and(|n| self.outputs > n) {
                self.cut = true;
                self.done = true;
                return Some(self.closing());
            }
            let kind = if self.strip_usage { kind } else { Kind::Data };
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

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
