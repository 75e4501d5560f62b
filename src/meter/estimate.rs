//! Tokenizer fallback: when the upstream reports no usage, count the prompt and the output
//! with tiktoken (o200k for the GPT-4o/4.1/5 and o-series families, cl100k otherwise). The
//! record is then marked `estimated`.

use std::sync::OnceLock;

use serde_json::Value;
use tiktoken_rs::CoreBPE;

fn bpe(model: &str) -> Option<&'static CoreBPE> {
    static O200K: OnceLock<Option<CoreBPE>> = OnceLock::new();
    static CL100K: OnceLock<Option<CoreBPE>> = OnceLock::new();
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
    if o200k {
        O200K
            .get_or_init(|| tiktoken_rs::o200k_base().ok())
            .as_ref()
    } else {
        CL100K
            .get_or_init(|| tiktoken_rs::cl100k_base().ok())
            .as_ref()
    }
}

/// Past this much text, count a prefix and scale by length: the count runs on the proxy's
/// thread and must stay bounded whatever a client sends.
const MAX_COUNTED: usize = 256 * 1024;

pub fn count(model: &str, text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    if text.len() > MAX_COUNTED {
        let mut cut = MAX_COUNTED;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let head = count(model, &text[..cut]);
        return (head as f64 * text.len() as f64 / cut as f64).round() as u64;
    }
    bpe(model).map_or_else(
        || text.len().div_ceil(4) as u64,
        |b| b.encode_ordinary(text).len() as u64,
    )
}

/// Prompt tokens of a request body. A huge body is not parsed into a tree on the proxy's
/// thread: about four bytes a token is close enough for an estimate of that size.
pub fn prompt_tokens(model: &str, body: &[u8]) -> u64 {
    if body.len() > 4 * MAX_COUNTED {
        return body.len().div_ceil(4) as u64;
    }
    count(model, &prompt_text(body))
}

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
        if let Some(t) = c.pointer("/message/content").or_else(|| c.get("text")) {
            collect_text(t, &mut out);
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
                    // A text part, or an item (a Responses input message) with content.
                    Value::Object(_) => {
                        if let Some(t) = item.get("text").or_else(|| item.get("content")) {
                            collect_text(t, out);
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

    #[test]
    fn huge_texts_are_counted_in_bounded_time_by_scaling_a_prefix() {
        let text = "hello world ".repeat(100_000);
        let n = count("gpt-4o", &text);
        assert!((190_000..=210_000).contains(&n), "{n}");
        assert_eq!(prompt_tokens("gpt-4o", &vec![b'x'; 2_000_000]), 500_000);
    }

    #[test]
    fn tokens_are_counted_with_the_family_tokenizer() {
        assert_eq!(count("gpt-4o-mini", "hello world"), 2);
        assert_eq!(count("some-local-model", "hello world"), 2);
        assert_eq!(count("gpt-4o", ""), 0);
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
