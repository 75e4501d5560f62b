//! Meter stage, SSE: where a chat event's `usage` member sits in its JSON (top level, not
//! inside a string or a nested object), so the meter can take out the usage the gateway asked
//! for on the client's behalf and leave every other byte as the upstream sent it.

use super::sse::USAGE;

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
pub(super) fn strip_usage_member(line: &[u8], only_null: bool) -> Option<Vec<u8>> {
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
