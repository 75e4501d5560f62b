//! Tokenizer fallback: when the upstream reports no usage, count the prompt and the output
//! with tiktoken (o200k for the GPT-4o/4.1/5 and o-series families, cl100k otherwise). The
//! record is then marked `estimated`.
//!
//! The counting runs on estimator threads (one a core), never on a proxy thread: loading a
//! tokenizer takes 25-90 ms of CPU and encoding a long text milliseconds, during which every
//! other connection of that proxy thread would wait. The threads share the tokenizers and drop
//! them after `KEEP_LOADED` without an estimate: they hold 18 MB (cl100k) and 20-35 MB (o200k)
//! of tables, and estimates are the exception (upstreams report usage).

use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tiktoken_rs::CoreBPE;

use super::Usage;

/// How long the estimator threads keep a tokenizer none has used. Reloading one costs at most
/// one 25-90 ms load (off the proxy threads) per this period.
const KEEP_LOADED: Duration = Duration::from_secs(5);

/// What an estimate counts, owned so that an estimator thread can count it.
pub struct Job {
    /// The model the upstream was asked for (it picks the tokenizer).
    pub model: String,
    /// The prompt tokens the upstream did report (a Messages stream cut after
    /// `message_start`); else the request body is counted.
    pub reported_prompt: Option<u64>,
    pub body: Bytes,
    pub output: Output,
}

/// The reply seen, to count as the output.
pub enum Output {
    Nothing,
    /// A stream's text, as the meter collected it.
    Text(String),
    /// A plain reply's JSON body.
    Reply(Vec<u8>),
    /// A plain reply too large to keep: its length (about four bytes a token).
    Bytes(u64),
}

impl Job {
    /// The count, with the tokenizers at hand.
    pub fn count(&self, t: &Tokenizers) -> Usage {
        let model = self.model.as_str();
        let prompt = self
            .reported_prompt
            .unwrap_or_else(|| t.prompt_tokens(model, &self.body));
        let completion = match &self.output {
            Output::Nothing => 0,
            Output::Text(text) => t.count(model, text),
            Output::Reply(body) => t.count(model, &reply_text(body)),
            Output::Bytes(n) => n.div_ceil(4),
        };
        usage(prompt, completion)
    }

    /// The count, made on an estimator thread while the caller's task waits (its proxy thread
    /// goes on with other connections). When none can take it (none started, `QUEUE` jobs
    /// already wait, or the count failed), or `give_up` resolves first (the shutdown's cut: a
    /// record never waits behind a long queue of counts then), about four bytes a token, never
    /// a tokenizer on the proxy thread.
    pub async fn count_off_thread(self, give_up: impl std::future::Future<Output = ()>) -> Usage {
        let job = Arc::new(self);
        let (tx, rx) = tokio::sync::oneshot::channel();
        if estimator().is_some_and(|e| e.try_send((job.clone(), tx)).is_ok()) {
            tokio::select! {
                biased;
                () = give_up => {}
                counted = rx => {
                    if let Ok(u) = counted {
                        return u;
                    }
                }
            }
        }
        job.rough()
    }

    /// About four bytes a token of the text: the estimate when the tokenizer cannot be used.
    pub fn rough(&self) -> Usage {
        let prompt = self
            .reported_prompt
            .unwrap_or_else(|| rough_json_text(&self.body));
        let completion = match &self.output {
            Output::Nothing => 0,
            Output::Text(t) => rough(t.as_bytes()),
            Output::Reply(b) => rough_json_text(b),
            Output::Bytes(n) => n.div_ceil(4),
        };
        usage(prompt, completion)
    }
}

fn usage(prompt: u64, completion: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt.saturating_add(completion),
        ..Usage::default()
    }
}

/// About four bytes a token.
fn rough(bytes: &[u8]) -> u64 {
    bytes.len().div_ceil(4) as u64
}

/// A string longer than this made only of what base64 and data URLs are written with is data
/// (an image, audio), not text. Text in a language written without spaces (CJK, Thai) or
/// written as `\u` escapes is text whatever its length.
const DATA_RUN: usize = 256;

fn data_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'+' | b'/' | b'=' | b'-' | b'_' | b':' | b';' | b',' | b'.'
        )
}

/// About four bytes a token of the text in a JSON body, in one pass without parsing it: its
/// string values, none that reads as encoded data. (Counting the whole body made a picture of
/// 1 MB a prompt of 275,000 tokens.) Jumps from quote to quote (`memchr`).
pub fn rough_json_text(body: &[u8]) -> u64 {
    let mut text = 0usize;
    let mut i = 0;
    while let Some(q) = memchr::memchr(b'"', &body[i..]) {
        let start = i + q + 1;
        // The string's end: the next quote no backslash escapes.
        let mut end = start;
        loop {
            match memchr::memchr2(b'"', b'\\', &body[end.min(body.len())..]) {
                Some(j) if body[end + j] == b'\\' => end += j + 2,
                Some(j) => {
                    end += j;
                    break;
                }
                None => {
                    end = body.len();
                    break;
                }
            }
        }
        let end = end.min(body.len());
        let value = &body[start..end];
        i = (end + 1).min(body.len());
        // A member's name (`"content":`) is not text either.
        let name = body[i..]
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| *b == b':');
        let data = value.len() > DATA_RUN && value.iter().all(|b| data_byte(*b));
        if !name && !data {
            text += value.len();
        }
        if i >= body.len() {
            break;
        }
    }
    text.div_ceil(4) as u64
}

type Request = (Arc<Job>, tokio::sync::oneshot::Sender<Usage>);

/// Estimates waiting for a thread, at most: past it a request takes the rough count rather
/// than queue behind thousands (each holding its body and reply).
const QUEUE: usize = 4096;

/// The estimator threads' queue, started at the first estimate: one thread a core (each
/// estimate is CPU work), sharing the tokenizers.
fn estimator() -> Option<&'static mpsc::SyncSender<Request>> {
    static TX: OnceLock<Option<mpsc::SyncSender<Request>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel::<Request>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let tokenizers = Arc::new(Tokenizers::default());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut started = 0;
        for _ in 0..cores {
            let (rx, tokenizers) = (rx.clone(), tokenizers.clone());
            let spawned = std::thread::Builder::new()
                .name("estimator".into())
                .spawn(move || estimate_loop(&rx, &tokenizers, KEEP_LOADED));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => tracing::warn!("an estimator thread did not start: {e}"),
            }
        }
        if started == 0 {
            tracing::warn!("no estimator thread: token estimates are rough (4 bytes a token)");
        }
        (started > 0).then_some(tx)
    })
    .as_ref()
}

/// Counts the jobs it takes from the shared queue (one thread waits on it at a time); the
/// tokenizers go when no job came for `keep` (a count still running keeps its own until done).
fn estimate_loop(rx: &Mutex<mpsc::Receiver<Request>>, tokenizers: &Tokenizers, keep: Duration) {
    loop {
        let next = match rx.lock() {
            Ok(rx) => rx.recv_timeout(keep),
            Err(_) => return,
        };
        match next {
            Ok((job, reply)) => {
                // A tokenizer that panics on some text costs that estimate its precision, not
                // the thread.
                let counted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    job.count(tokenizers)
                }));
                let _ = reply.send(counted.unwrap_or_else(|_| job.rough()));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                tokenizers.unload();
                crate::ops::alloc::trim_thread_cache();
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// The tokenizers loaded so far, each at its first use (a second thread needing the same
/// one meanwhile waits for that load rather than making its own).
#[derive(Default)]
pub struct Tokenizers {
    o200k: Mutex<Option<Arc<CoreBPE>>>,
    cl100k: Mutex<Option<Arc<CoreBPE>>>,
}

impl Tokenizers {
    fn unload(&self) {
        for slot in [&self.o200k, &self.cl100k] {
            *slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
    }

    fn bpe(&self, model: &str) -> Option<Arc<CoreBPE>> {
        let m = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        let o200k = [
            "gpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "o1",
            "o3",
            "o4",
            "chatgpt-4o",
            "gpt-oss",
        ]
        .iter()
        .any(|p| m.starts_with(p));
        let slot = if o200k { &self.o200k } else { &self.cl100k };
        // A load that panicked left the slot empty: the next one tries again.
        let mut slot = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_none() {
            let loaded = if o200k {
                tiktoken_rs::o200k_base()
            } else {
                tiktoken_rs::cl100k_base()
            };
            *slot = loaded.ok().map(Arc::new);
        }
        slot.clone()
    }

    pub fn count(&self, model: &str, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        if text.len() > MAX_COUNTED {
            let mut cut = MAX_COUNTED;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let head = self.count(model, &text[..cut]);
            return (head as f64 * text.len() as f64 / cut as f64).round() as u64;
        }
        self.bpe(model).map_or_else(
            || rough(text.as_bytes()),
            |b| b.encode_ordinary(text).len() as u64,
        )
    }

    /// Prompt tokens of a request body: its text (a huge one counted by a prefix, see
    /// `count`); images, audio and the JSON around them are not text. A body past
    /// `MAX_PARSED` is not parsed into a tree (a flood of them would hold every estimator
    /// thread): about four bytes a token of its text.
    pub fn prompt_tokens(&self, model: &str, body: &[u8]) -> u64 {
        if body.len() > MAX_PARSED {
            return rough_json_text(body);
        }
        self.count(model, &prompt_text(body))
    }
}

/// The largest body parsed for its prompt's text.
const MAX_PARSED: usize = 4 * 1024 * 1024;

/// Past this much text, count a prefix and scale by length: a count must stay bounded
/// whatever a client sends (one thread serves every request's estimate).
const MAX_COUNTED: usize = 256 * 1024;

/// The text a request asks about: chat and Messages `messages` content (strings or text
/// parts), a `system` prompt or Responses `instructions`, a completion `prompt`, or the
/// `input` of embeddings, moderations and the Responses API (a string or input items).
pub fn prompt_text(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    let mut out = String::new();
    if let Some(messages) = v.get("messages").and_then(Value::as_array) {
        for m in messages {
            collect_text(m.get("content").unwrap_or(&Value::Null), &mut out);
        }
    }
    for field in ["system", "instructions", "prompt", "input"] {
        if let Some(p) = v.get(field) {
            collect_text(p, &mut out);
        }
    }
    out
}

/// The output text of a plain reply: chat or completion choices, a Messages reply's
/// `content` blocks, or a Responses reply's `output` items.
pub fn reply_text(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    let mut out = String::new();
    if let Some(content) = v.get("content") {
        collect_text(content, &mut out);
    }
    if let Some(output) = v.get("output") {
        collect_text(output, &mut out);
    }
    for c in v
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        // A reasoning model's reasoning, the content, and the tool calls' names and arguments.
        for field in [
            "/message/reasoning_content",
            "/message/reasoning",
            "/message/content",
            "/text",
        ] {
            if let Some(t) = c.pointer(field) {
                collect_text(t, &mut out);
            }
        }
        for call in c
            .pointer("/message/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for field in ["/function/name", "/function/arguments"] {
                if let Some(t) = call.pointer(field) {
                    collect_text(t, &mut out);
                }
            }
        }
    }
    out
}

fn collect_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(s);
        }
        Value::Array(items) => {
            for item in items {
                match item {
                    // A text part, or an item (a Responses input message) with content; a
                    // tool call (Messages `tool_use`, Responses `function_call`): its name and
                    // arguments; a Responses reasoning item: its summary.
                    Value::Object(o) => {
                        if let Some(t) = o.get("text").or_else(|| o.get("content")) {
                            collect_text(t, out);
                        }
                        let kind = o.get("type").and_then(Value::as_str);
                        if matches!(kind, Some("tool_use" | "function_call")) {
                            for field in ["name", "arguments"] {
                                if let Some(t) = o.get(field) {
                                    collect_text(t, out);
                                }
                            }
                            if let Some(input) = o.get("input").filter(|i| i.is_object()) {
                                collect_text(&Value::String(input.to_string()), out);
                            }
                        }
                        if let Some(summary) = o.get("summary") {
                            collect_text(summary, out);
                        }
                        if kind == Some("thinking") {
                            if let Some(t) = o.get("thinking") {
                                collect_text(t, out);
                            }
                        }
                    }
                    other => collect_text(other, out),
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chat with a picture of 1.1 MB: the estimate counts the question, not the picture's
    /// bytes (275,057 tokens before), also when it is rough (the shutdown's cut).
    #[test]
    fn a_picture_in_the_prompt_is_not_counted_as_text() {
        let picture = format!("data:image/png;base64,{}", "iVBORw0KGgo".repeat(100_000));
        let body = serde_json::json!({
            "model": "gpt-4o",
            "stream": true,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "describe this picture"},
                {"type": "image_url", "image_url": {"url": picture}},
            ]}],
        })
        .to_string();
        assert!(body.len() > 1_000_000);
        let t = Tokenizers::default();
        assert_eq!(t.prompt_tokens("gpt-4o", body.as_bytes()), 3);
        let job = Job {
            model: "gpt-4o".into(),
            reported_prompt: None,
            body: Bytes::from(body),
            output: Output::Reply(
                br#"{"choices":[{"message":{"content":"a cat on a mat"}}]}"#.to_vec(),
            ),
        };
        let rough = job.rough();
        assert!(rough.prompt_tokens < 40, "{rough:?}");
        assert!((3..40).contains(&rough.completion_tokens), "{rough:?}");
        // Text with escapes and line breaks is text, whatever its length.
        let long = format!("{{\"prompt\":\"{}\"}}", "word\\n".repeat(100));
        assert_eq!(rough_json_text(long.as_bytes()), 150);
        // The members' names are not text: a chat saying "hi" is about a token, plus its
        // model's name and role.
        let hi = br#"{"model":"echo-1","stream":true,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}"#;
        assert_eq!(rough_json_text(hi), 3);
        // Text written without spaces (CJK), or as \u escapes, is text whatever its length.
        let cjk =
            serde_json::json!({"messages": [{"role": "user", "content": "你好世界".repeat(100)}]});
        assert_eq!(
            rough_json_text(cjk.to_string().as_bytes()),
            (4 + 1200_usize).div_ceil(4) as u64
        );
        let escaped = format!("{{\"prompt\":\"{}\"}}", "\\u4f60\\u597d".repeat(50));
        assert_eq!(rough_json_text(escaped.as_bytes()), 150);
    }

    proptest::proptest! {
        /// Any bytes: no panic, never more than the bytes allow. Any text value in JSON: its
        /// written bytes, its member's name left out.
        #[test]
        fn the_rough_count_takes_the_text_of_any_json(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
            text in "[a-z\"\\\\\n ]{0,300} [a-z]{0,8}",
        ) {
            proptest::prop_assert!(rough_json_text(&bytes) <= bytes.len().div_ceil(4) as u64);
            let value = serde_json::Value::String(text).to_string();
            let body = format!("{{ \"messages\" : {value} }}");
            proptest::prop_assert_eq!(
                rough_json_text(body.as_bytes()),
                (value.len() - 2).div_ceil(4) as u64
            );
        }
    }

    #[test]
    fn messages_and_responses_tool_calls_and_reasoning_are_output() {
        let messages = serde_json::json!({"content": [
            {"type": "thinking", "thinking": "x"},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
        ]});
        assert_eq!(
            reply_text(messages.to_string().as_bytes()),
            "x\nget_weather\n{\"city\":\"Paris\"}"
        );
        let responses = serde_json::json!({"output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Needs a tool."}]},
            {"type": "function_call", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        ]});
        assert_eq!(
            reply_text(responses.to_string().as_bytes()),
            "Needs a tool.\nget_weather\n{\"city\":\"Paris\"}"
        );
    }

    #[test]
    fn a_reply_of_tool_calls_or_reasoning_has_output() {
        let reply = serde_json::json!({"choices": [{"index": 0, "message": {
            "role": "assistant", "content": null, "reasoning_content": "Weather needs a tool.",
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}],
        }}]});
        assert_eq!(
            reply_text(reply.to_string().as_bytes()),
            "Weather needs a tool.\nget_weather\n{\"city\": \"Paris\"}"
        );
    }

    #[test]
    fn huge_texts_are_counted_in_bounded_time_by_scaling_a_prefix() {
        let t = Tokenizers::default();
        let text = "hello world ".repeat(100_000);
        let n = t.count("gpt-4o", &text);
        assert!((190_000..=210_000).contains(&n), "{n}");
        // A body of 2.4 MB of text: parsed, its text counted by a prefix.
        let body = serde_json::json!({"prompt": text.repeat(2)}).to_string();
        let n = t.prompt_tokens("gpt-4o", body.as_bytes());
        assert!((380_000..=420_000).contains(&n), "{n}");
    }

    #[tokio::test]
    async fn an_estimate_made_on_the_estimator_thread_is_the_count_made_here() {
        let job = || Job {
            model: "gpt-4o".into(),
            reported_prompt: None,
            body: Bytes::from_static(
                br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}"#,
            ),
            output: Output::Reply(br#"{"choices":[{"message":{"content":"hi there"}}]}"#.to_vec()),
        };
        let here = job().count(&Tokenizers::default());
        assert_eq!((here.prompt_tokens, here.completion_tokens), (2, 2));
        for _ in 0..3 {
            assert_eq!(job().count_off_thread(std::future::pending()).await, here);
        }
        // Given up on (the shutdown's cut), the count is the rough one at once.
        let rough = job().rough();
        assert_ne!(rough, here);
        assert_eq!(job().count_off_thread(std::future::ready(())).await, rough);
        let reported = Job {
            reported_prompt: Some(7),
            output: Output::Nothing,
            ..job()
        };
        assert_eq!(
            reported
                .count_off_thread(std::future::pending())
                .await
                .total_tokens,
            7
        );
        // Two threads share the queue and the tokenizers, which go after a quiet spell and
        // are loaded again at the next estimate.
        let (tx, rx) = mpsc::channel();
        let rx = Arc::new(Mutex::new(rx));
        let tokenizers = Arc::new(Tokenizers::default());
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (rx, t) = (rx.clone(), tokenizers.clone());
                std::thread::spawn(move || estimate_loop(&rx, &t, Duration::from_millis(1)))
            })
            .collect();
        for _ in 0..2 {
            let (reply, answer) = tokio::sync::oneshot::channel();
            tx.send((Arc::new(job()), reply)).expect("send");
            assert_eq!(answer.await.expect("answer"), here);
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while tokenizers.o200k.lock().expect("lock").is_some() {
                assert!(std::time::Instant::now() < deadline, "never unloaded");
                std::thread::yield_now();
            }
        }
        drop(tx);
        for w in workers {
            w.join().expect("each loop ends with its queue");
        }
    }

    #[test]
    fn tokens_are_counted_with_the_family_tokenizer() {
        let t = Tokenizers::default();
        assert_eq!(t.count("gpt-4o-mini", "hello world"), 2);
        assert_eq!(t.count("some-local-model", "hello world"), 2);
        assert_eq!(t.count("gpt-4o", ""), 0);
    }

    #[test]
    fn prompt_text_takes_messages_parts_and_prompts() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"a b"},{"role":"user","content":[{"type":"text","text":"c"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        assert_eq!(prompt_text(body), "a b\nc");
        assert_eq!(prompt_text(br#"{"prompt":["x","y"]}"#), "x\ny");
        let responses = br#"{"instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#;
        assert_eq!(prompt_text(responses), "be brief\nhi");
        let messages = br#"{"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"}]}"#;
        assert_eq!(prompt_text(messages), "q\ns");
        assert_eq!(
            reply_text(br#"{"content":[{"type":"text","text":"a"}]}"#),
            "a"
        );
        assert_eq!(
            reply_text(
                br#"{"output":[{"type":"message","content":[{"type":"output_text","text":"b"}]}]}"#
            ),
            "b"
        );
        assert_eq!(
            reply_text(br#"{"choices":[{"message":{"content":"hi there"}}]}"#),
            "hi there"
        );
    }
}
