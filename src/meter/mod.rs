//! Metering stage: token usage from replies as they pass, never changing what the client
//! would get from the upstream. Streams go through `sse::SseMeter`; plain JSON replies are
//! held (bounded) and their `usage` read at the end; images and audio are priced per request.
//! When the upstream reports no usage, `estimate` counts with a tokenizer.

pub mod decode;
pub mod estimate;
#[cfg(test)]
mod props;
pub mod sse;
mod sse_usage;

use bytes::Bytes;
use serde::Deserialize;

/// Token counts in the record's terms, from any of the usage shapes upstreams send
/// (`RawUsage::counts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every prompt token, cached and cache-write ones included (OpenAI's convention).
    pub prompt_tokens: u64,
    /// Every output token, reasoning included.
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Of `prompt_tokens`: read from the provider's prompt cache.
    pub cached_tokens: u64,
    /// Of `prompt_tokens`: written to the provider's prompt cache.
    pub cache_write_tokens: u64,
    /// Of `completion_tokens`: the model's reasoning.
    pub reasoning_tokens: u64,
}

/// The most tokens one count of one request may say: more than any model's context and any
/// batch an API takes. A larger figure is not believed (the request is estimated instead):
/// one absurd reply must not spend a key's budget for good or overflow the store's sums.
pub const MAX_TOKENS: u64 = 100_000_000;

/// A `usage` object as sent: OpenAI's chat names (`prompt_tokens`, `completion_tokens`), the
/// Responses and Anthropic names (`input_tokens`, `output_tokens`), and Anthropic's cache
/// counts, which its `input_tokens` leaves out. A field may be absent or null. Only a JSON
/// object is read as one (an array is `malformed`, not fields by position).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(remote = "Self")]
pub struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    /// OpenAI's details: Chat Completions (`prompt_tokens_details`,
    /// `completion_tokens_details`) and the Responses API (`input_tokens_details`,
    /// `output_tokens_details`).
    #[serde(default, alias = "input_tokens_details")]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default, alias = "output_tokens_details")]
    completion_tokens_details: Option<OutputDetails>,
    /// Not an object: it counts nothing.
    #[serde(skip)]
    malformed: bool,
}

/// The prompt's cache counts in OpenAI's usage details.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    cache_write_tokens: Option<u64>,
}

/// The output's reasoning count in OpenAI's usage details.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl<'de> Deserialize<'de> for RawUsage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RawUsage, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = RawUsage;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a usage object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawUsage, A::Error> {
                RawUsage::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<RawUsage, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(RawUsage {
                    malformed: true,
                    ..RawUsage::default()
                })
            }
        }
        d.deserialize_any(Object)
    }
}

impl RawUsage {
    /// Anthropic streams report usage in parts (`message_start`, then cumulative counts in
    /// `message_delta`): a later part's fields replace the earlier ones it carries.
    pub fn merge(&mut self, later: RawUsage) {
        let fields = [
            (&mut self.prompt_tokens, later.prompt_tokens),
            (&mut self.completion_tokens, later.completion_tokens),
            (&mut self.total_tokens, later.total_tokens),
            (&mut self.input_tokens, later.input_tokens),
            (&mut self.output_tokens, later.output_tokens),
            (
                &mut self.cache_creation_input_tokens,
                later.cache_creation_input_tokens,
            ),
            (
                &mut self.cache_read_input_tokens,
                later.cache_read_input_tokens,
            ),
        ];
        for (mine, theirs) in fields {
            if theirs.is_some() {
                *mine = theirs;
            }
        }
        if later.prompt_tokens_details.is_some() {
            self.prompt_tokens_details = later.prompt_tokens_details;
        }
        if later.completion_tokens_details.is_some() {
            self.completion_tokens_details = later.completion_tokens_details;
        }
    }

    /// (cached, cache-write, reasoning), as reported.
    fn details(&self) -> [Option<u64>; 3] {
        let prompt = self.prompt_tokens_details.unwrap_or_default();
        let output = self.completion_tokens_details.unwrap_or_default();
        [
            self.cache_read_input_tokens.or(prompt.cached_tokens),
            self.cache_creation_input_tokens
                .or(prompt.cache_write_tokens),
            output.reasoning_tokens,
        ]
    }

    /// Whether the prompt side was counted.
    pub fn has_prompt(&self) -> bool {
        self.prompt_tokens.is_some() || self.input_tokens.is_some()
    }

    /// The counts, when they are to be believed: None for a usage that counts nothing (`{}`,
    /// every field null, not an object) or says more than `MAX_TOKENS` anywhere. The request
    /// is then estimated, as one without usage.
    pub fn counts(self) -> Option<Usage> {
        let all = [
            self.prompt_tokens,
            self.completion_tokens,
            self.total_tokens,
            self.input_tokens,
            self.output_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ];
        let believed = !self.malformed
            && all.iter().any(Option::is_some)
            && all
                .iter()
                .chain(self.details().iter())
                .flatten()
                .all(|n| *n <= MAX_TOKENS);
        believed.then(|| Usage::from(self))
    }
}

impl From<RawUsage> for Usage {
    fn from(r: RawUsage) -> Usage {
        let completion = r.completion_tokens.or(r.output_tokens).unwrap_or(0);
        let prompt_side = [
            r.input_tokens,
            r.cache_creation_input_tokens,
            r.cache_read_input_tokens,
        ];
        let prompt = match r.prompt_tokens {
            Some(p) => p,
            None if prompt_side.iter().any(Option::is_some) => prompt_side
                .into_iter()
                .flatten()
                .fold(0u64, u64::saturating_add),
            // A total alone (some embeddings servers): what is not completion is the prompt.
            None => r.total_tokens.map_or(0, |t| t.saturating_sub(completion)),
        };
        // A total below the sum of its parts is not one; above it (a server counting thinking
        // tokens apart, say) it stands as sent. Neither changes the cost.
        let sum = prompt.saturating_add(completion);
        // Parts of the prompt and of the output: never more than the whole they are part of.
        let [cached, written, reasoning] = r.details().map(|n| n.unwrap_or(0));
        let cached = cached.min(prompt);
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: r.total_tokens.map_or(sum, |t| t.max(sum)),
            cached_tokens: cached,
            cache_write_tokens: written.min(prompt - cached),
            reasoning_tokens: reasoning.min(completion),
        }
    }
}

#[derive(Deserialize)]
struct WithUsage {
    #[serde(default)]
    usage: Option<RawUsage>,
}

/// The counts of a JSON reply's or event's `usage`, if it has one to be believed.
pub fn usage_from_json(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<WithUsage>(body)
        .ok()?
        .usage?
        .counts()
}

/// The counts of the top-level `usage` of a JSON reply of which only the tail is at hand: the
/// last `"usage":` key there (a string's own quotes are escaped, so the bytes `"usage"` are a
/// key or a string value; a value is not followed by `:`).
pub fn usage_from_tail(tail: &[u8]) -> Option<Usage> {
    const KEY: &[u8] = b"\"usage\"";
    let mut end = tail.len();
    while let Some(at) = tail[..end].windows(KEY.len()).rposition(|w| w == KEY) {
        end = at;
        let rest = &tail[at + KEY.len()..];
        let rest = rest.trim_ascii_start();
        let Some(value) = rest.strip_prefix(b":") else {
            continue;
        };
        let mut values = serde_json::Deserializer::from_slice(value).into_iter::<RawUsage>();
        if let Some(Ok(raw)) = values.next() {
            return raw.counts();
        }
    }
    None
}

/// `MODELGATE_METERING=off` turns metering off (records then carry no tokens). It exists only
/// so `benches/load.sh` can measure what metering costs against the same build without it.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MODELGATE_METERING").map_or(true, |v| v != "off"))
}

/// Largest plain reply held whole to read its usage; of a larger one only its last `TAIL`
/// bytes are kept, where its `usage` is (servers write it last).
const MAX_JSON: usize = 16 * 1024 * 1024;

/// What is kept of the end of a plain reply larger than `MAX_JSON`.
const TAIL: usize = 64 * 1024;

/// How a reply is metered, decided from the endpoint and `stream` before it is sent.
#[derive(Debug, Default)]
pub enum Meter {
    /// Per-request price only (images, audio, models, usage, errors).
    #[default]
    None,
    /// A plain JSON reply with `usage` (chat, completions, embeddings, moderations).
    Json {
        /// The reply, or once it is larger than `MAX_JSON`, its last `TAIL` bytes at least.
        buf: Vec<u8>,
        /// The reply's length when it is larger than `MAX_JSON` (0: `buf` is all of it).
        too_big: u64,
        /// Estimate with the tokenizer when the reply has no usage (false: only what the
        /// upstream reports counts, for endpoints whose body is not a prompt).
        estimate: bool,
        /// `usage` of `buf` as it is, read once: the journal asks before the reply's last
        /// byte goes out and the record again at the end (each piece fed clears it).
        read: std::sync::OnceLock<Option<Usage>>,
    },
    Sse(Box<sse::SseMeter>),
}

impl Meter {
    pub fn json() -> Meter {
        Meter::Json {
            buf: Vec::new(),
            too_big: 0,
            estimate: true,
            read: std::sync::OnceLock::new(),
        }
    }

    /// A plain reply whose `usage` counts when present, never estimated.
    pub fn json_reported() -> Meter {
        Meter::Json {
            buf: Vec::new(),
            too_big: 0,
            estimate: false,
            read: std::sync::OnceLock::new(),
        }
    }

    /// Feeds one piece of the reply body; returns whether content has reached the client
    /// (the caller notes the first time, for `ttft_ms`).
    pub fn feed(&mut self, body: &mut Option<Bytes>, end: bool) -> bool {
        match self {
            Meter::None => body.as_ref().is_some_and(|b| !b.is_empty()),
            Meter::Json {
                buf, too_big, read, ..
            } => {
                let Some(b) = body.as_ref() else { return false };
                if !b.is_empty() {
                    read.take();
                }
                if *too_big == 0 && buf.len() + b.len() <= MAX_JSON {
                    buf.extend_from_slice(b);
                } else {
                    // Past the bound only the tail is kept (at most twice `TAIL`, cut back
                    // to `TAIL` when it grows past that).
                    if *too_big == 0 {
                        *too_big = buf.len() as u64;
                    }
                    *too_big += b.len() as u64;
                    buf.extend_from_slice(b);
                    if buf.len() > 2 * TAIL {
                        buf.drain(..buf.len() - TAIL);
                        buf.shrink_to(2 * TAIL);
                    }
                }
                !b.is_empty()
            }
            Meter::Sse(m) => {
                let piece = body.take().unwrap_or_default();
                let out = m.feed(piece, end);
                *body = (!out.is_empty() || end).then_some(out);
                m.saw_content
            }
        }
    }

    /// The upstream's own usage figures, if it reported them.
    pub fn usage(&self) -> Option<Usage> {
        match self {
            Meter::None => None,
            Meter::Json {
                buf, too_big, read, ..
            } => *read.get_or_init(|| match too_big {
                0 => usage_from_json(buf),
                _ => usage_from_tail(buf),
            }),
            Meter::Sse(m) => m.usage,
        }
    }

    /// The id the upstream gave a Responses API reply (to find where it is stored).
    pub fn response_id(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct WithId {
            id: Option<String>,
        }
        match self {
            Meter::Json {
                buf, too_big: 0, ..
            } => serde_json::from_slice::<WithId>(buf).ok()?.id,
            Meter::Json { .. } => None,
            Meter::Sse(m) => m.response_id.clone(),
            Meter::None => None,
        }
    }

    /// The reply seen, for estimating when there is no usage.
    pub fn output(&self) -> estimate::Output {
        match self {
            Meter::Sse(m) => estimate::Output::Text(m.text()),
            Meter::Json {
                buf, too_big: 0, ..
            } => estimate::Output::Reply(buf.clone()),
            Meter::Json { too_big, .. } => estimate::Output::Bytes(*too_big),
            Meter::None => estimate::Output::Nothing,
        }
    }

    /// Whether the meter changes the bytes (SSE with usage stripped, or cut by the budget).
    pub fn edits_body(&self) -> bool {
        matches!(self, Meter::Sse(m) if m.edits())
    }

    /// A stream is cut after `n` output events (see `SseMeter::cut_after`).
    pub fn cut_after(&mut self, n: u64) {
        if let Meter::Sse(m) = self {
            m.cut_after(n);
        }
    }

    /// The stream was cut by its budget: the output events it passed.
    pub fn cut_by_budget(&self) -> Option<u64> {
        match self {
            Meter::Sse(m) if m.cut => Some(m.outputs.saturating_sub(1)),
            _ => None,
        }
    }

    /// The upstream answered a stream request with a plain JSON reply: it is metered as one,
    /// from its `usage` (estimated when it has none, where the stream would have been).
    pub fn plain_reply(&mut self) {
        if let Meter::Sse(m) = self {
            *self = if m.reported_only {
                Meter::json_reported()
            } else {
                Meter::json()
            };
        }
    }

    pub fn is_metered(&self) -> bool {
        !matches!(self, Meter::None)
    }

    /// Whether missing usage is estimated with the tokenizer.
    pub fn estimates(&self) -> bool {
        match self {
            Meter::None => false,
            Meter::Json { estimate, .. } => *estimate,
            Meter::Sse(m) => !m.reported_only,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The usage read is kept until another piece comes: read before the reply is whole, it
    /// is read again after.
    #[test]
    fn a_plain_replys_usage_is_read_once_and_again_after_a_new_piece() {
        let mut m = Meter::json();
        let (head, tail) = (
            &br#"{"id":"x","usage":{"prompt_tokens":4,"#[..],
            &br#""completion_tokens":8,"total_tokens":12}}"#[..],
        );
        m.feed(&mut Some(Bytes::from_static(head)), false);
        assert_eq!(m.usage(), None);
        m.feed(&mut Some(Bytes::from_static(tail)), true);
        assert_eq!(m.usage().map(|u| u.total_tokens), Some(12));
        assert_eq!(m.usage().map(|u| u.total_tokens), Some(12));
    }

    #[test]
    fn plain_reply_usage_is_read_and_null_usage_is_none() {
        let u = usage_from_json(
            br#"{"id":"x","usage":{"prompt_tokens":4,"completion_tokens":8,"total_tokens":12}}"#,
        );
        assert_eq!(u.map(|u| u.total_tokens), Some(12));
        assert_eq!(usage_from_json(br#"{"usage":null}"#), None);
        assert_eq!(usage_from_json(b"not json"), None);
        let embeddings =
            usage_from_json(br#"{"usage":{"prompt_tokens":5,"total_tokens":5}}"#).expect("usage");
        assert_eq!(
            (embeddings.prompt_tokens, embeddings.completion_tokens),
            (5, 0)
        );
    }

    /// Each API's usage shape with cache and reasoning counts (OpenAI's Chat Completions and
    /// Responses references; Anthropic's Messages reference and its prompt-caching page):
    /// the prompt counts every prompt token, its parts said apart.
    #[test]
    fn cached_cache_write_and_reasoning_tokens_are_read_from_every_shape() {
        let u = |body: &str| usage_from_json(body.as_bytes()).expect("usage");
        let chat = u(
            r#"{"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,
            "prompt_tokens_details":{"cached_tokens":1920,"cache_write_tokens":0,"audio_tokens":0},
            "completion_tokens_details":{"reasoning_tokens":192,"audio_tokens":0}}}"#,
        );
        assert_eq!(
            (
                chat.prompt_tokens,
                chat.cached_tokens,
                chat.completion_tokens,
                chat.reasoning_tokens
            ),
            (2006, 1920, 300, 192)
        );
        let responses = u(
            r#"{"usage":{"input_tokens":328,"input_tokens_details":{"cached_tokens":128,"cache_write_tokens":64},
            "output_tokens":52,"output_tokens_details":{"reasoning_tokens":16},"total_tokens":380}}"#,
        );
        assert_eq!(
            (
                responses.prompt_tokens,
                responses.cached_tokens,
                responses.cache_write_tokens,
                responses.reasoning_tokens
            ),
            (328, 128, 64, 16)
        );
        let anthropic = u(
            r#"{"usage":{"input_tokens":21,"cache_creation_input_tokens":188086,
            "cache_read_input_tokens":0,"output_tokens":393}}"#,
        );
        assert_eq!(
            (
                anthropic.prompt_tokens,
                anthropic.cache_write_tokens,
                anthropic.cached_tokens
            ),
            (188_107, 188_086, 0)
        );
        // A part said larger than its whole is capped at it; null details count nothing.
        let odd = u(r#"{"usage":{"prompt_tokens":10,"completion_tokens":5,
            "prompt_tokens_details":{"cached_tokens":50},"completion_tokens_details":null}}"#);
        assert_eq!((odd.cached_tokens, odd.reasoning_tokens), (10, 0));
    }

    #[test]
    fn a_json_reply_fed_in_pieces_is_metered_at_the_end() {
        let mut m = Meter::json();
        let reply = br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#;
        for piece in reply.chunks(7) {
            let mut b = Some(Bytes::copy_from_slice(piece));
            assert!(m.feed(&mut b, false));
            assert_eq!(b.as_deref(), Some(piece), "plain replies pass unchanged");
        }
        assert_eq!(m.usage().map(|u| u.total_tokens), Some(3));
    }

    #[test]
    fn usage_that_counts_nothing_or_too_much_is_not_believed() {
        let counted = |body: &str| usage_from_json(body.as_bytes());
        for unbelieved in [
            r#"{"usage":{}}"#,
            r#"{"usage":{"prompt_tokens":null,"completion_tokens":null}}"#,
            r#"{"usage":[1,2,3]}"#,
            r#"{"usage":{"prompt_tokens":100000001,"completion_tokens":1}}"#,
            r#"{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":9223372036854775807}}"#,
            r#"{"usage":{"input_tokens":3,"cache_read_input_tokens":18446744073709551615}}"#,
            r#"{"usage":{"prompt_tokens":-1,"completion_tokens":1}}"#,
            r#"{"usage":{"prompt_tokens":"lots"}}"#,
        ] {
            assert_eq!(counted(unbelieved), None, "{unbelieved}");
        }
        let most = counted(r#"{"usage":{"prompt_tokens":100000000,"completion_tokens":0}}"#);
        assert_eq!(most.map(|u| u.prompt_tokens), Some(MAX_TOKENS));
        // A total below its parts is their sum; above them it stands.
        let low =
            counted(r#"{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":1}}"#);
        assert_eq!(low.map(|u| u.total_tokens), Some(7));
        let high =
            counted(r#"{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":20}}"#);
        assert_eq!(high.map(|u| u.total_tokens), Some(20));
        // A total alone (some embeddings servers) is the prompt's.
        let total = counted(r#"{"usage":{"total_tokens":12}}"#);
        assert_eq!(
            total.map(|u| (u.prompt_tokens, u.completion_tokens)),
            Some((12, 0))
        );
        let zero = counted(r#"{"usage":{"prompt_tokens":0,"completion_tokens":0}}"#);
        assert_eq!(zero, Some(Usage::default()), "zero is a count");
    }

    /// A reply too large to hold is metered from its tail: the last `"usage":` key there,
    /// not a string value `"usage"`, nor the text of one inside a string (escaped).
    #[test]
    fn usage_is_read_from_a_tail() {
        let tail = br#"xx","note":"usage","text":"say \"usage\": {\"prompt_tokens\":9}","usage":{"prompt_tokens":4,"completion_tokens":8,"total_tokens":12}}"#;
        let u = usage_from_tail(tail).expect("usage");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (4, 8));
        assert_eq!(usage_from_tail(br#"a","usage":"none"}"#), None);
        assert_eq!(
            usage_from_tail(br#"{"usage": {"input_tokens":2,"output_tokens":3}}"#)
                .map(|u| u.total_tokens),
            Some(5)
        );
        // Held past the bound, only the tail stays, and the usage is read from it.
        let mut m = Meter::json();
        let big = vec![b' '; MAX_JSON];
        let mut piece = Some(Bytes::from_static(b"{\"pad\":\""));
        m.feed(&mut piece, false);
        for _ in 0..2 {
            let mut p = Some(Bytes::from(big.clone()));
            m.feed(&mut p, false);
        }
        let mut end = Some(Bytes::from_static(
            br#"","usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        ));
        m.feed(&mut end, true);
        assert_eq!(m.usage().map(|u| u.completion_tokens), Some(2));
        assert!(matches!(&m, Meter::Json { buf, .. } if buf.len() <= 2 * TAIL));
        assert!(matches!(m.output(), estimate::Output::Bytes(n) if n > 2 * MAX_JSON as u64));
    }
}
