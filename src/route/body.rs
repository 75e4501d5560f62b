//! Route stage, body part: find `model` in a request body (top-level JSON field or multipart
//! form field) and splice in the upstream's model name without touching any other byte.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::GatewayError;

/// What the gateway needs from a request body.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Probe {
    pub model: String,
    pub stream: bool,
    /// Byte range of the model's value in the body (JSON: the quoted string; multipart: the
    /// field's content), for splicing.
    pub model_span: (usize, usize),
    pub multipart_boundary: Option<String>,
    /// The client asked for `stream_options.include_usage`.
    pub include_usage: bool,
    /// Byte range of the `stream_options` value, if present (JSON only).
    pub stream_options_span: Option<(usize, usize)>,
    /// `messages`: None when absent (or null), else whether it is an array (JSON only).
    pub messages: Option<bool>,
    /// `max_tokens`: None when absent (or null), else whether it is a positive integer.
    pub max_tokens: Option<bool>,
    /// The output limits the body sets, each a field's name, its value when a whole number,
    /// and its value's byte range (JSON only).
    pub output_limits: Vec<OutputLimit>,
}

/// An output limit a request body sets (`max_tokens`, `max_completion_tokens`,
/// `max_output_tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLimit {
    pub field: &'static str,
    pub value: Option<u64>,
    pub span: (usize, usize),
}

impl Probe {
    /// The output the request allows: the least whole-number limit it sets.
    pub fn output_limit(&self) -> Option<u64> {
        self.output_limits.iter().filter_map(|l| l.value).min()
    }
}

#[derive(Deserialize)]
struct JsonProbe<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<serde_json::Value>,
    /// Kept even when `null` (a plain Option would drop it), so it is replaced in place.
    #[serde(default, borrow, deserialize_with = "raw_even_null")]
    stream_options: Option<&'a RawValue>,
    #[serde(default, borrow)]
    messages: Option<&'a RawValue>,
    #[serde(default, borrow)]
    max_tokens: Option<&'a RawValue>,
    #[serde(default, borrow)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(default, borrow)]
    max_output_tokens: Option<&'a RawValue>,
}

fn raw_even_null<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Reads `model` (and `stream`) from a JSON body, validating the whole document without
/// building it. Unknown fields are skipped.
pub fn probe_json(body: &[u8]) -> Result<Probe, GatewayError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(GatewayError::InvalidJson("the body is empty".into()));
    }
    // serde would also fill a struct from a JSON array: only an object is a request.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => GatewayError::InvalidParameter {
                    param: "body",
                    message: "The request body must be a JSON object.".into(),
                },
                Err(e) => GatewayError::InvalidJson(e.to_string()),
            },
        );
    }
    let p: JsonProbe = serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => GatewayError::InvalidParameter {
            param: "body",
            message: format!("The request body must be a JSON object: {e}"),
        },
        _ => GatewayError::InvalidJson(e.to_string()),
    })?;
    let raw = p.model.ok_or(GatewayError::MissingParameter("model"))?;
    let model: Cow<str> =
        serde_json::from_str(raw.get()).map_err(|_| GatewayError::InvalidParameter {
            param: "model",
            message: "'model' must be a string.".into(),
        })?;
    if model.is_empty() {
        return Err(GatewayError::MissingParameter("model"));
    }
    check_model_len(&model)?;
    let stream = match p.stream {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => b,
        Some(_) => {
            return Err(GatewayError::InvalidParameter {
                param: "stream",
                message: "'stream' must be a boolean.".into(),
            });
        }
    };
    // A RawValue borrows from `body`, so its address gives its offset.
    let span = |r: &RawValue| {
        let start = r.get().as_ptr() as usize - body.as_ptr() as usize;
        (start, start + r.get().len())
    };
    let include_usage = p
        .stream_options
        .and_then(|so| serde_json::from_str::<StreamOptions>(so.get()).ok())
        .and_then(|so| so.include_usage)
        .unwrap_or(false);
    Ok(Probe {
        model: model.into_owned(),
        stream,
        model_span: span(raw),
        multipart_boundary: None,
        include_usage,
        stream_options_span: p.stream_options.map(span),
        messages: p
            .messages
            .filter(|m| m.get() != "null")
            .map(|m| m.get().starts_with('[')),
        max_tokens: p
            .max_tokens
            .filter(|m| m.get() != "null")
            .map(|m| m.get().parse::<u64>().is_ok_and(|n| n > 0)),
        output_limits: [
            ("max_tokens", p.max_tokens),
            ("max_completion_tokens", p.max_completion_tokens),
            ("max_output_tokens", p.max_output_tokens),
        ]
        .into_iter()
        .filter_map(|(field, raw)| {
            let raw = raw.filter(|r| r.get() != "null")?;
            Some(OutputLimit {
                field,
                value: raw.get().parse::<u64>().ok(),
                span: span(raw),
            })
        })
        .collect(),
    })
}

/// An Anthropic message asks for a reply of at most `max_tokens` (required there, a positive
/// integer).
pub fn require_max_tokens(p: &Probe) -> Result<(), GatewayError> {
    require(p.max_tokens, "max_tokens", "a positive integer")
}

/// A chat completion names its conversation: `messages`, an array (the API's only required
/// field besides `model`). Caught here, the client gets the contract's 400 instead of
/// whatever the upstream makes of it.
pub fn require_messages(p: &Probe) -> Result<(), GatewayError> {
    require(p.messages, "messages", "an array")
}

/// A required field: absent (None), or present and not `what` (false), is the client's 400.
fn require(found: Option<bool>, param: &'static str, what: &str) -> Result<(), GatewayError> {
    match found {
        None => Err(GatewayError::MissingParameter(param)),
        Some(false) => Err(GatewayError::InvalidParameter {
            param,
            message: format!("'{param}' must be {what}."),
        }),
        Some(true) => Ok(()),
    }
}

pub use crate::config::MAX_MODEL_LEN;

fn check_model_len(model: &str) -> Result<(), GatewayError> {
    if model.len() > MAX_MODEL_LEN {
        return Err(GatewayError::InvalidParameter {
            param: "model",
            message: format!("'model' is longer than {MAX_MODEL_LEN} bytes."),
        });
    }
    Ok(())
}

/// The boundary of a `multipart/form-data` content type.
pub fn multipart_boundary(content_type: &str) -> Option<String> {
    if !content_type
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        return None;
    }
    multer::parse_boundary(content_type).ok()
}

/// Reads the `model` field of a multipart form with multer, then locates its bytes.
pub async fn probe_multipart(body: &Bytes, boundary: &str) -> Result<Probe, GatewayError> {
    let bad = |m: String| GatewayError::InvalidParameter {
        param: "body",
        message: format!("Malformed multipart form: {m}"),
    };
    let chunk = body.clone();
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(chunk) });
    let mut form = multer::Multipart::new(stream, boundary);
    let mut model = None;
    let mut model_index = 0;
    let mut fields = 0;
    let mut model_fields = 0;
    let mut stream_flag = false;
    while let Some(field) = form.next_field().await.map_err(|e| bad(e.to_string()))? {
        fields += 1;
        if field
            .name()
            .is_some_and(|n| n.eq_ignore_ascii_case("model"))
        {
            model_fields += 1;
            // A file part named `model` is a file to a form parser upstream, not the field the
            // gateway would route and charge by.
            if field.file_name().is_some() {
                return Err(GatewayError::InvalidParameter {
                    param: "model",
                    message: "The form's 'model' part is a file (it has a filename): send the \
                              model as a plain field."
                        .into(),
                });
            }
        }
        match field.name() {
            Some("model") if model.is_none() => {
                model_index = field.index();
                model = Some(field.text().await.map_err(|e| bad(e.to_string()))?)
            }
            Some("stream") => {
                stream_flag = field.text().await.map_err(|e| bad(e.to_string()))?.trim() == "true"
            }
            _ => {
                // Drain the field so the parser moves on.
                field.bytes().await.map_err(|e| bad(e.to_string()))?;
            }
        }
    }
    // One model field only: with two, the gateway and the upstream could each read another.
    if model_fields > 1 {
        return Err(GatewayError::InvalidParameter {
            param: "model",
            message: "The form has more than one 'model' field.".into(),
        });
    }
    let model = model
        .filter(|m| !m.is_empty())
        .ok_or(GatewayError::MissingParameter("model"))?;
    check_model_len(&model)?;
    // The bytes spliced must be the value checked: the form is cut into parts again by its
    // own scan, which must see as many parts as multer and one part naming `model` (to any
    // parser: a `name` parameter equal to it in any case, among other `name`s), the one multer
    // read, holding exactly the bytes it read.
    let (parts, spans) = multipart_field_spans(body, boundary, "model");
    let model_span = match spans.as_slice() {
        [(at, span)]
            if parts == fields
                && *at == model_index
                && body.get(span.0..span.1) == Some(model.as_bytes()) =>
        {
            *span
        }
        [] | [_] => return Err(bad("cannot locate the model field".into())),
        _ => {
            return Err(GatewayError::InvalidParameter {
                param: "model",
                message: "The form has more than one 'model' field.".into(),
            });
        }
    };
    Ok(Probe {
        model,
        stream: stream_flag,
        model_span,
        multipart_boundary: Some(boundary.to_string()),
        include_usage: false,
        stream_options_span: None,
        messages: None,
        max_tokens: None,
        output_limits: Vec::new(),
    })
}

/// A byte range of the body, start and end.
type Span = (usize, usize);

/// The number of parts, and the ordinal and content's byte range of every part whose
/// Content-Disposition has a `name` parameter
/// equal to `name` in any case (quoted or not), wherever it stands among the parameters. Parts
/// are delimited by `\r\n--boundary` (the first may start the body), which by RFC 2046 never
/// occurs inside a part, and end at the close delimiter (the epilogue after it is no part); a
/// part that cannot be read counts but is not looked into. Where multer reads the form
/// otherwise (it takes `--boundary` anywhere in the preamble as the first delimiter, or reads
/// a part's name another way), the probe's checks refuse the form.
fn multipart_field_spans(body: &[u8], boundary: &str, name: &str) -> (usize, Vec<(usize, Span)>) {
    let delim = format!("\r\n--{boundary}");
    // Each delimiter's (start, end); the first may open the body without its CR LF.
    let mut marks: Vec<(usize, usize)> = Vec::new();
    if body.starts_with(&delim.as_bytes()[2..]) {
        marks.push((0, delim.len() - 2));
    }
    marks
        .extend(memchr::memmem::find_iter(body, delim.as_bytes()).map(|at| (at, at + delim.len())));
    let mut spans = Vec::new();
    let mut parts = 0;
    for pair in marks.windows(2) {
        let ((_, start), (end, _)) = (pair[0], pair[1]);
        // The close delimiter (`--boundary--`): what follows is the epilogue, not parts.
        if body[start..].starts_with(b"--") {
            break;
        }
        let ordinal = parts;
        parts += 1;
        let part = &body[start..end];
        let Some(head_end) = memchr::memmem::find(part, b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&part[..head_end]);
        let names_it = head.lines().any(|l| {
            let l = l.trim_start();
            l.get(..20)
                .is_some_and(|h| h.eq_ignore_ascii_case("content-disposition:"))
                && l.split(';').any(|p| {
                    p.split_once('=').is_some_and(|(k, v)| {
                        k.trim().eq_ignore_ascii_case("name")
                            && v.trim().trim_matches('"').eq_ignore_ascii_case(name)
                    })
                })
        });
        if names_it {
            let content = start + head_end + 4;
            spans.push((ordinal, (content, end.max(content))));
        }
    }
    (parts, spans)
}

/// The body as the upstream gets it: the model's value replaced by `upstream_model` (if
/// given) and, for a JSON stream, `stream_options.include_usage` set so the upstream reports
/// usage. Every other byte stays as the client sent it.
pub fn for_upstream(
    body: &Bytes,
    probe: &Probe,
    upstream_model: Option<&str>,
    ask_usage: bool,
) -> Bytes {
    for_upstream_limited(body, probe, upstream_model, ask_usage, None)
}

/// `for_upstream`, with the output limited to `limit.0` tokens (JSON only): every limit the
/// body sets above it is lowered to it, and a body that sets none gets `limit.1` (the
/// endpoint's own field) set to it.
pub fn for_upstream_limited(
    body: &Bytes,
    probe: &Probe,
    upstream_model: Option<&str>,
    ask_usage: bool,
    limit: Option<(u64, &'static str)>,
) -> Bytes {
    // (start, end, replacement): spans of the body, none overlapping another.
    let mut edits: Vec<(usize, usize, String)> = Vec::with_capacity(2);
    if let (Some((n, field)), None) = (limit, &probe.multipart_boundary) {
        for l in &probe.output_limits {
            if l.value.is_some_and(|v| v > n) {
                edits.push((
                    l.span.0,
                    l.span.1,
                    itoa::Buffer::new().format(n).to_string(),
                ));
            }
        }
        if probe.output_limits.is_empty() {
            let at = body.iter().position(|b| *b == b'{').map_or(0, |i| i + 1);
            let mut member = String::with_capacity(field.len() + 24);
            member.push('"');
            member.push_str(field);
            member.push_str("\":");
            member.push_str(itoa::Buffer::new().format(n));
            member.push(',');
            edits.push((at, at, member));
        }
    }
    if let Some(m) = upstream_model {
        let value = if probe.multipart_boundary.is_some() {
            m.to_string()
        } else {
            serde_json::Value::String(m.to_string()).to_string()
        };
        edits.push((probe.model_span.0, probe.model_span.1, value));
    }
    if ask_usage && probe.multipart_boundary.is_none() {
        match probe.stream_options_span {
            Some((start, end)) => {
                let mut so: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(&body[start..end]).unwrap_or_default();
                so.insert("include_usage".into(), serde_json::Value::Bool(true));
                edits.push((start, end, serde_json::Value::Object(so).to_string()));
            }
            None => {
                // Right after the opening brace; the object has at least `model`, so a comma follows.
                let at = body.iter().position(|b| *b == b'{').map_or(0, |i| i + 1);
                edits.push((
                    at,
                    at,
                    r#""stream_options":{"include_usage":true},"#.to_string(),
                ));
            }
        }
    }
    if edits.is_empty() {
        return body.clone();
    }
    // One pass front to back into a buffer of the final size (no growing, no shifting).
    edits.sort_by_key(|e| e.0);
    let grow: usize = edits.iter().map(|e| e.2.len()).sum();
    let mut out = Vec::with_capacity(body.len() + grow);
    let mut at = 0;
    for (start, end, value) in &edits {
        out.extend_from_slice(&body[at..*start]);
        out.extend_from_slice(value.as_bytes());
        at = *end;
    }
    out.extend_from_slice(&body[at..]);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_model_is_found_at_top_level_only() {
        let body = br#"{"messages":[{"role":"user","content":"{\"model\":\"x\"}","model":"inner"}],"model":"echo-1","stream":true}"#;
        let p = probe_json(body).expect("ok");
        assert_eq!(p.model, "echo-1");
        assert!(p.stream);
        assert_eq!(&body[p.model_span.0..p.model_span.1], br#""echo-1""#);
        let out = for_upstream(
            &Bytes::from_static(body),
            &p,
            Some("upstream/\"big\""),
            false,
        );
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["model"], "upstream/\"big\"");
        assert_eq!(v["messages"][0]["model"], "inner");
    }

    #[test]
    fn an_output_limit_is_lowered_or_set() {
        let body = br#"{"model":"m","max_tokens":500,"max_completion_tokens":40,"messages":[]}"#;
        let p = probe_json(body).expect("ok");
        assert_eq!(p.output_limit(), Some(40));
        let body = Bytes::from_static(body);
        let out = for_upstream_limited(&body, &p, None, true, Some((100, "max_completion_tokens")));
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["max_tokens"], 100, "lowered");
        assert_eq!(v["max_completion_tokens"], 40, "already below");
        assert_eq!(v["stream_options"]["include_usage"], true);
        // None set: the endpoint's own field is added, beside the usage request.
        let bare = Bytes::from_static(br#"{"model":"m","input":"hi"}"#);
        let p = probe_json(&bare).expect("ok");
        assert_eq!(p.output_limit(), None);
        let out = for_upstream_limited(&bare, &p, Some("u"), true, Some((7, "max_output_tokens")));
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["max_output_tokens"], 7);
        assert_eq!(v["model"], "u");
        assert_eq!(v["input"], "hi");
    }

    #[test]
    fn json_errors_have_the_contract_codes() {
        assert!(matches!(
            probe_json(b"{nope"),
            Err(GatewayError::InvalidJson(_))
        ));
        assert!(matches!(probe_json(b""), Err(GatewayError::InvalidJson(_))));
        assert_eq!(
            probe_json(br#"{"messages":[]}"#),
            Err(GatewayError::MissingParameter("model"))
        );
        assert!(matches!(
            probe_json(br#"{"model":5}"#),
            Err(GatewayError::InvalidParameter { param: "model", .. })
        ));
        assert!(matches!(
            probe_json(b"[1]"),
            Err(GatewayError::InvalidParameter { param: "body", .. })
        ));
        assert!(matches!(
            probe_json(br#"["echo-1", true]"#),
            Err(GatewayError::InvalidParameter { param: "body", .. })
        ));
        assert!(matches!(
            probe_json(b"[1"),
            Err(GatewayError::InvalidJson(_))
        ));
        assert!(matches!(
            probe_json(br#"{"model":"a","stream":"yes"}"#),
            Err(GatewayError::InvalidParameter {
                param: "stream",
                ..
            })
        ));
    }

    #[test]
    fn include_usage_is_asked_for_without_touching_other_bytes() {
        let body = Bytes::from_static(br#"{"model":"a","stream":true,"messages":[]}"#);
        let p = probe_json(&body).expect("ok");
        assert!(!p.include_usage);
        let out = for_upstream(&body, &p, Some("upstream-b"), true);
        assert_eq!(
            std::str::from_utf8(&out).expect("utf-8"),
            r#"{"stream_options":{"include_usage":true},"model":"upstream-b","stream":true,"messages":[]}"#
        );
        let body = Bytes::from_static(
            br#"{"model":"a","stream":true,"stream_options":{"include_usage":false,"x":1}}"#,
        );
        let p = probe_json(&body).expect("ok");
        let out = for_upstream(&body, &p, None, true);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(
            v["stream_options"],
            serde_json::json!({"include_usage": true, "x": 1})
        );
        let asked =
            probe_json(br#"{"model":"a","stream_options":{"include_usage":true}}"#).expect("ok");
        assert!(asked.include_usage);
    }

    #[test]
    fn escaped_model_names_are_decoded() {
        let p = probe_json(br#"{"model":"a\u002fb"}"#).expect("ok");
        assert_eq!(p.model, "a/b");
    }

    fn form() -> Bytes {
        Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--\x00model\r\n--XyZ\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ--\r\n",
        )
    }

    #[tokio::test]
    async fn multipart_model_is_found_and_spliced() {
        let body = form();
        let p = probe_multipart(&body, "XyZ").await.expect("ok");
        assert_eq!(p.model, "whisper-1");
        let out = for_upstream(&body, &p, Some("whisper-large"), true);
        let again = probe_multipart(&out, "XyZ").await.expect("ok");
        assert_eq!(again.model, "whisper-large");
        assert!(out.starts_with(&body[..body.len() - 30]));
    }

    #[tokio::test]
    async fn multipart_without_model_or_malformed_is_refused() {
        let body = Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc\r\n--XyZ--\r\n",
        );
        assert_eq!(
            probe_multipart(&body, "XyZ").await,
            Err(GatewayError::MissingParameter("model"))
        );
        let broken = Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nabc",
        );
        assert!(probe_multipart(&broken, "XyZ").await.is_err());
    }

    #[tokio::test]
    async fn a_model_part_that_is_a_file_is_refused() {
        let file = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"; filename=\"m.txt\"\r\n\r\nwhisper-1\r\n--XyZ--\r\n");
        assert!(matches!(
            probe_multipart(&file, "XyZ").await,
            Err(GatewayError::InvalidParameter { param: "model", .. })
        ));
    }

    #[tokio::test]
    async fn two_model_fields_are_refused_and_only_an_exact_name_counts() {
        let two = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\na\r\n--XyZ\r\nContent-Disposition: form-data; name=\"MODEL\"\r\n\r\nb\r\n--XyZ--\r\n");
        assert!(matches!(
            probe_multipart(&two, "XyZ").await,
            Err(GatewayError::InvalidParameter { param: "model", .. })
        ));
        let upper = Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"MODEL\"\r\n\r\na\r\n--XyZ--\r\n",
        );
        assert_eq!(
            probe_multipart(&upper, "XyZ").await,
            Err(GatewayError::MissingParameter("model"))
        );
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/multipart_body.rs`): a part whose disposition has
    /// an unreadable `name` before `name="model"` was not a model field to multer but was to
    /// the splice, so the value checked and the value rewritten were in different parts.
    #[tokio::test]
    async fn a_part_naming_model_among_other_names_is_one_more_model_field() {
        let crash = Bytes::from_static(b"--fuzzboundary\r\nContent-Disposition: form-data; name=\x8bta; name=\"model\"\r\n\r\nwhispe@r-1\r\n--fuzz\r\nwh\r\n--fuzzboundary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhispe@r-1\r\n--fuzzboundary--\r\n");
        assert!(matches!(
            probe_multipart(&crash, "fuzzboundary").await,
            Err(GatewayError::InvalidParameter { param: "model", .. })
        ));
        // Found by fuzzing too: a form, closed, then an epilogue holding another model part,
        // with a preamble only multer reads as a delimiter. The splice went into the epilogue,
        // which an upstream ignores.
        let crash = Bytes::from_static(b"-\xadfuzzboundary\r\nCon--fuzzboundary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhispe@r-0\r\n--fuzzboundary--\r\nzboundary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhispe@r-0\r\n--fuzzboundary--\r\n");
        assert!(probe_multipart(&crash, "fuzzboundary").await.is_err());
        let epilogue = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm-1\r\n--XyZ--\r\n\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm-1\r\n--XyZ--\r\n");
        let p = probe_multipart(&epilogue, "XyZ").await.expect("ok");
        let close = memchr::memmem::find(&epilogue, b"--XyZ--").expect("closed");
        assert!(
            p.model_span.1 <= close,
            "{:?} is past the close",
            p.model_span
        );
        // And a third: a part multer reads without a name, which the scan took for the model
        // part, holding the same value as the model part multer read further on.
        let crash = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nm-1\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm-1\r\n--XyZ--\r\n");
        let p = probe_multipart(&crash, "XyZ").await.expect("ok");
        assert!(p.model_span.0 > 60, "the second part's: {:?}", p.model_span);
        let stray = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/corpus/multipart_body/unnamed-part-same-value"
        ))
        .expect("the fuzz input");
        let stray = Bytes::from(stray);
        if let Ok(p) = probe_multipart(&stray, "fuzzboundary").await {
            let out = for_upstream(&stray, &p, Some("whisper-up"), false);
            let again = probe_multipart(&out, "fuzzboundary")
                .await
                .expect("probes again");
            assert_eq!(again.model, "whisper-up");
        }
        // One part naming model twice over is read by multer as whichever name it takes; the
        // bytes spliced must then be the value it read, or the form is refused.
        for head in [
            "name=\"file\"; name=\"model\"",
            "name=\"model\"; name=\"file\"",
            "name=model",
            "name=\"Model\"",
        ] {
            let body = Bytes::from(format!(
                "--XyZ\r\nContent-Disposition: form-data; {head}\r\n\r\nm-1\r\n--XyZ--\r\n"
            ));
            match probe_multipart(&body, "XyZ").await {
                Ok(p) => {
                    assert_eq!(&body[p.model_span.0..p.model_span.1], b"m-1", "{head}");
                    let out = for_upstream(&body, &p, Some("up-2"), false);
                    let again = probe_multipart(&out, "XyZ").await.expect("probes again");
                    assert_eq!(again.model, "up-2", "{head}");
                }
                Err(e) => assert!(
                    matches!(
                        e,
                        GatewayError::InvalidParameter { .. } | GatewayError::MissingParameter(_)
                    ),
                    "{head}: {e:?}"
                ),
            }
        }
    }

    #[tokio::test]
    async fn a_file_containing_the_boundary_text_mid_line_is_fine() {
        let body = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc--XyZdef\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm1\r\n--XyZ--\r\n");
        let p = probe_multipart(&body, "XyZ").await.expect("ok");
        assert_eq!(&body[p.model_span.0..p.model_span.1], b"m1");
    }

    #[test]
    fn overlong_model_names_and_null_stream_options_are_handled() {
        let long = format!(r#"{{"model":"{}"}}"#, "m".repeat(300));
        assert!(matches!(
            probe_json(long.as_bytes()),
            Err(GatewayError::InvalidParameter { param: "model", .. })
        ));
        let body = Bytes::from_static(br#"{"model":"a","stream":true,"stream_options":null}"#);
        let p = probe_json(&body).expect("ok");
        let out = for_upstream(&body, &p, None, true);
        assert_eq!(
            std::str::from_utf8(&out).expect("utf-8"),
            r#"{"model":"a","stream":true,"stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn boundary_is_read_from_content_type() {
        assert_eq!(
            multipart_boundary("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(multipart_boundary("application/json"), None);
    }
}
