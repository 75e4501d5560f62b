//! What the mock "model" says and how it counts: the reply words (cycling), prompt tokens as
//! whitespace-separated words, and the `usage` object. All pure, so tests can predict every
//! reply and every usage number.

use serde_json::{Map, Value, json};

/// The words the mock "model" says, in order, cycling. Non-ASCII on purpose so that tests
/// exercise UTF-8 characters split across reads.
pub const REPLY_WORDS: [&str; 10] = [
    "Hello",
    "from",
    "the",
    "mock",
    "café",
    "naïve",
    "✓",
    "日本語",
    "model",
    "upstream",
];

/// Number of whitespace-separated words.
pub(super) fn count_words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The completion tokens: word `i` of [`REPLY_WORDS`] (cycling), each followed by a space
/// except the last.
pub(super) fn reply_tokens(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let word = REPLY_WORDS[i % REPLY_WORDS.len()];
            if i + 1 < n {
                format!("{word} ")
            } else {
                word.to_string()
            }
        })
        .collect()
}

/// The full reply text for `n` tokens, as the mock sends it.
pub fn reply_text(n: usize) -> String {
    reply_tokens(n).concat()
}

/// Words in a chat message `content` (a string, or an array of parts whose text parts count).
fn content_words(content: &Value) -> usize {
    match content {
        Value::String(s) => count_words(s),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part {
                Value::String(s) => count_words(s),
                Value::Object(obj) => {
                    let is_text = obj
                        .get("type")
                        .and_then(Value::as_str)
                        .is_none_or(|t| t == "text");
                    if is_text {
                        obj.get("text")
                            .and_then(Value::as_str)
                            .map_or(0, count_words)
                    } else {
                        0
                    }
                }
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

/// `prompt_tokens` of a chat request: words in all message contents, at least 1.
pub(super) fn chat_prompt_tokens(body: &Map<String, Value>) -> usize {
    body.get("messages")
        .and_then(Value::as_array)
        .map_or(0, |messages| {
            messages
                .iter()
                .map(|m| m.get("content").map_or(0, content_words))
                .sum()
        })
        .max(1)
}

/// `prompt_tokens` of a legacy completion request (`prompt` string, strings, or token arrays).
pub(super) fn completion_prompt_tokens(body: &Map<String, Value>) -> usize {
    fn prompt_words(v: &Value) -> usize {
        match v {
            Value::String(s) => count_words(s),
            Value::Number(_) => 1,
            Value::Array(items) => items.iter().map(prompt_words).sum(),
            _ => 0,
        }
    }
    body.get("prompt").map_or(0, prompt_words).max(1)
}

pub(super) fn usage_json(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn words_are_counted() {
        assert_eq!(count_words(""), 0);
        assert_eq!(count_words("  hello   world\n again\t"), 3);
        let body = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "one two three"},
                {"type": "image_url", "image_url": {"url": "http://x/y z"}},
            ]},
            {"role": "assistant", "content": null},
        ]});
        assert_eq!(chat_prompt_tokens(body.as_object().unwrap()), 5);
        let empty = json!({"messages": []});
        assert_eq!(chat_prompt_tokens(empty.as_object().unwrap()), 1);
        let prompts = json!({"prompt": ["a b", "c"]});
        assert_eq!(completion_prompt_tokens(prompts.as_object().unwrap()), 3);
    }

    #[test]
    fn reply_text_is_deterministic() {
        assert_eq!(reply_text(0), "");
        assert_eq!(reply_text(1), "Hello");
        assert_eq!(reply_text(3), "Hello from the");
        assert_eq!(
            reply_text(12),
            "Hello from the mock café naïve ✓ 日本語 model upstream Hello from"
        );
        let tokens = reply_tokens(4);
        assert_eq!(tokens, vec!["Hello ", "from ", "the ", "mock"]);
    }
}
