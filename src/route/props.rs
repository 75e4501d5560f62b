//! Property tests of the body probe and the model splice: for any JSON request (members in any
//! order, any model name, `model` also inside strings and nested objects, any whitespace), the
//! probe finds the top-level model, and the body sent upstream differs from the client's only
//! in the model's value (and, when the gateway asks for usage, in `stream_options`).

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::body::{for_upstream, probe_json};

/// Any JSON string value, written with serde's escaping or with \u escapes for every char.
fn text() -> impl Strategy<Value = String> {
    "(\\PC|[\"\\\\/\n\t\u{0}]){0,16}"
}

fn written(s: &str, escaped: bool) -> String {
    if escaped {
        let mut out = String::from("\"");
        for u in s.encode_utf16() {
            out += &format!("\\u{u:04x}");
        }
        out + "\""
    } else {
        Value::String(s.to_string()).to_string()
    }
}

#[derive(Debug, Clone)]
struct Request {
    model: String,
    escaped: bool,
    decoy: String,
    stream: Option<bool>,
    stream_options: Option<bool>,
    order: Vec<usize>,
    space: String,
}

fn request() -> impl Strategy<Value = Request> {
    (
        // An empty model is a missing one (400), tested elsewhere.
        text().prop_filter("a model", |m| !m.is_empty()),
        any::<bool>(),
        text(),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<bool>()),
        Just(vec![0usize, 1, 2, 3, 4]).prop_shuffle(),
        "[ \t\r\n]{0,3}",
    )
        .prop_map(
            |(model, escaped, decoy, stream, stream_options, order, space)| Request {
                model,
                escaped,
                decoy,
                stream,
                stream_options,
                order,
                space,
            },
        )
}

impl Request {
    fn body(&self) -> String {
        let sp = &self.space;
        let decoy = Value::String(format!("\"model\":\"{}\"", self.decoy)).to_string();
        let members: Vec<Option<String>> = vec![
            Some(format!(
                "\"model\"{sp}:{sp}{}",
                written(&self.model, self.escaped)
            )),
            Some(format!(
                "\"messages\":[{{\"role\":\"user\",\"content\":{decoy},\"model\":{}}}]",
                written(&self.decoy, false)
            )),
            self.stream.map(|s| format!("\"stream\":{s}")),
            self.stream_options
                .map(|u| format!("\"stream_options\":{{\"include_usage\":{u},\"x\":1}}")),
            Some(format!(
                "\"metadata\":{{\"model\":{}}}",
                written(&self.decoy, false)
            )),
        ];
        let parts: Vec<String> = self
            .order
            .iter()
            .filter_map(|&i| members[i].clone())
            .collect();
        format!("{sp}{{{sp}{}{sp}}}{sp}", parts.join(&format!(",{sp}")))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_probe_finds_the_top_level_model_and_the_splice_changes_only_it(
        req in request(),
        upstream_model in text(),
    ) {
        let body = Bytes::from(req.body());
        let original: Value = serde_json::from_slice(&body).expect("valid JSON");
        let probe = probe_json(&body).expect("probe");
        prop_assert_eq!(&probe.model, &req.model);
        prop_assert_eq!(probe.stream, req.stream == Some(true));

        let out = for_upstream(&body, &probe, Some(&upstream_model), false);
        let (start, end) = probe.model_span;
        // Byte for byte: the same before and after the model's value.
        prop_assert_eq!(&out[..start], &body[..start]);
        prop_assert_eq!(&out[out.len() - (body.len() - end)..], &body[end..]);
        let mut want = original.clone();
        want["model"] = json!(upstream_model);
        let got: Value = serde_json::from_slice(&out).expect("still JSON");
        prop_assert_eq!(got, want.clone());

        // Asking the upstream for usage: `stream_options.include_usage` becomes true, its other
        // members stay, nothing else changes.
        let asked = for_upstream(&body, &probe, Some(&upstream_model), true);
        let got: Value = serde_json::from_slice(&asked).expect("still JSON");
        match want.get_mut("stream_options") {
            Some(so) => so["include_usage"] = json!(true),
            None => want["stream_options"] = json!({"include_usage": true}),
        }
        prop_assert_eq!(got, want);
    }

    #[test]
    fn any_bytes_are_probed_without_panicking(body in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(p) = probe_json(&body) {
            let out = for_upstream(&Bytes::from(body.clone()), &p, Some("m"), true);
            prop_assert!(serde_json::from_slice::<Value>(&out).is_ok());
        }
    }
}
