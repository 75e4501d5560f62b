//! Metering stage: token usage from replies as they pass. `SseMeter` is fed each piece of a
//! streamed body (events split at any byte, several per piece) and keeps only the unfinished
//! line; `usage_from_json` reads a plain reply's `usage`. Observes bytes, never changes them.

use serde::Deserialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

#[derive(Deserialize)]
struct WithUsage {
    #[serde(default)]
    usage: Option<Usage>,
}

/// The `usage` object of a JSON reply or event, if it has a non-null one.
pub fn usage_from_json(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<WithUsage>(body).ok()?.usage
}

/// Longest line kept while waiting for its end; a longer one is dropped from metering (the
/// bytes still reach the client) so a misbehaving upstream cannot grow memory without bound.
const MAX_LINE: usize = 1024 * 1024;

#[derive(Debug, Default)]
pub struct SseMeter {
    tail: Vec<u8>,
    skipping_long_line: bool,
    pub usage: Option<Usage>,
    pub events: u64,
    pub done: bool,
    /// Whether any event carried output content (for time-to-first-token).
    pub saw_content: bool,
}

impl SseMeter {
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(nl) = memchr::memchr(b'\n', rest) {
            let (piece, after) = rest.split_at(nl);
            rest = &after[1..];
            if self.skipping_long_line {
                self.skipping_long_line = false;
                continue;
            }
            if self.tail.is_empty() {
                self.line(piece);
            } else {
                let mut line = std::mem::take(&mut self.tail);
                line.extend_from_slice(piece);
                self.line(&line);
            }
        }
        if !self.skipping_long_line {
            self.tail.extend_from_slice(rest);
            if self.tail.len() > MAX_LINE {
                self.tail = Vec::new();
                self.skipping_long_line = true;
            }
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        self.events += 1;
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        if memchr::memmem::find(data, b"\"usage\"").is_some() {
            if let Some(u) = usage_from_json(data) {
                self.usage = Some(u);
            }
        }
        // Cheap byte check first; parse only events that may carry text.
        if !self.saw_content
            && memchr::memmem::find(data, b"\"content\":\"").is_some()
            && has_content(data)
        {
            self.saw_content = true;
        }
    }
}

/// Whether a chat/completion chunk carries non-empty output text.
fn has_content(data: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Chunk {
        #[serde(default)]
        choices: Vec<Choice>,
    }
    #[derive(Deserialize)]
    struct Choice {
        delta: Option<Delta>,
        text: Option<String>,
    }
    #[derive(Deserialize)]
    struct Delta {
        content: Option<String>,
    }
    serde_json::from_slice::<Chunk>(data).is_ok_and(|c| {
        c.choices.iter().any(|ch| {
            ch.delta
                .as_ref()
                .and_then(|d| d.content.as_deref())
                .is_some_and(|s| !s.is_empty())
                || ch.text.as_deref().is_some_and(|s| !s.is_empty())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\u{e9} \u{2713}\"}}],\"usage\":null}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\r\n\r\n",
        "data: [DONE]\n\n",
    );

    fn check(m: &SseMeter) {
        assert_eq!(
            m.usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3,
                total_tokens: 10
            })
        );
        assert_eq!(m.events, 5);
        assert!(m.done && m.saw_content);
        assert!(m.tail.is_empty());
    }

    #[test]
    fn a_stream_fed_whole_is_metered() {
        let mut m = SseMeter::default();
        m.feed(STREAM.as_bytes());
        check(&m);
    }

    #[test]
    fn every_split_point_and_piece_size_gives_the_same_result() {
        let bytes = STREAM.as_bytes();
        for size in 1..=bytes.len() {
            let mut m = SseMeter::default();
            for piece in bytes.chunks(size) {
                m.feed(piece);
            }
            check(&m);
        }
        for cut in 0..bytes.len() {
            let mut m = SseMeter::default();
            m.feed(&bytes[..cut]);
            m.feed(&bytes[cut..]);
            check(&m);
        }
    }

    #[test]
    fn a_stream_without_usage_reports_none_and_an_empty_role_chunk_is_not_content() {
        let mut m = SseMeter::default();
        m.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
        assert!(!m.saw_content);
        m.feed(b"data: [DONE]\n\n");
        assert_eq!(m.usage, None);
        assert!(m.done);
    }

    #[test]
    fn an_overlong_line_is_dropped_without_growing_memory() {
        let mut m = SseMeter::default();
        let junk = vec![b'x'; 600 * 1024];
        m.feed(b"data: ");
        m.feed(&junk);
        m.feed(&junk);
        assert!(m.tail.len() <= MAX_LINE);
        m.feed(b"\n\ndata: [DONE]\n\n");
        assert!(m.done);
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
}
