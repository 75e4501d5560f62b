//! Property test of the path check: a path the gateway takes as written (`canonical`) names
//! the same endpoint to an upstream server that decodes percent escapes, turns `\` into `/`,
//! drops `;` parameters, merges slashes, resolves dot segments or ignores case, whichever of
//! those it does. Else a key allowed only `other` could reach chat under another spelling, or
//! a stream be metered as the wrong API.

use proptest::prelude::*;

use super::endpoint::{Group, Target, canonical, classify};

const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/audio/transcriptions",
    "/v1/audio/speech",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/rerank",
    "/v1/x/chat/completions",
];

/// One way to spell a path differently.
#[derive(Debug, Clone)]
enum Edit {
    /// Percent-encode the byte at this position (upper or lower case hex).
    Encode(usize, bool),
    /// Insert this piece at this position.
    Insert(usize, &'static str),
    /// Upper-case the byte at this position.
    Upper(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<bool>()).prop_map(|(i, u)| Edit::Encode(i, u)),
        (
            any::<usize>(),
            prop::sample::select(vec![
                "/", "/.", "/..", "/./", "/../", "/x/..", ";", ";a=b", "\\", "%2F", "%2e", "%00",
                "%20", "%", "%G1", "%252F", "/v1", "~", "\t", "é", "%C3%A9",
            ])
        )
            .prop_map(|(i, s)| Edit::Insert(i, s)),
        any::<usize>().prop_map(Edit::Upper),
    ]
}

fn apply(path: &str, edits: &[Edit]) -> String {
    let mut b = path.as_bytes().to_vec();
    for e in edits {
        // Never before the leading `/`.
        let at = |i: usize| 1 + i % b.len().max(1);
        match e {
            Edit::Encode(i, upper) => {
                let i = at(*i).min(b.len() - 1);
                let hex = if *upper {
                    format!("%{:02X}", b[i])
                } else {
                    format!("%{:02x}", b[i])
                };
                b.splice(i..=i, hex.into_bytes());
            }
            Edit::Insert(i, s) => {
                let i = at(*i).min(b.len());
                b.splice(i..i, s.bytes());
            }
            Edit::Upper(i) => {
                let i = at(*i).min(b.len() - 1);
                b[i] = b[i].to_ascii_uppercase();
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn decode(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(c)) => {
                out.push(c);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn segments(path: &str, f: impl Fn(Vec<&str>) -> Vec<String>) -> String {
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    format!("/{}", f(parts).join("/"))
}

/// What an upstream server may do to a path before it routes it, one step at a time.
fn normalisations(path: &str) -> Vec<String> {
    let no_params = segments(path, |s| {
        s.iter()
            .map(|seg| seg.split(';').next().unwrap_or("").to_string())
            .collect()
    });
    let merged = segments(path, |s| {
        s.iter()
            .filter(|seg| !seg.is_empty())
            .map(|s| s.to_string())
            .collect()
    });
    let resolved = segments(path, |s| {
        let mut out: Vec<String> = Vec::new();
        for seg in s {
            match seg {
                "." => {}
                ".." => {
                    out.pop();
                }
                other => out.push(other.to_string()),
            }
        }
        out
    });
    let mut all = vec![
        decode(path),
        path.replace('\\', "/"),
        no_params,
        merged,
        resolved,
        path.to_ascii_lowercase(),
    ];
    // And all of them at once.
    let mut p = decode(path).replace('\\', "/").to_ascii_lowercase();
    for _ in 0..3 {
        p = normalisations_once(&p);
    }
    all.push(p);
    all
}

fn normalisations_once(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let mut out: Vec<&str> = Vec::new();
    for seg in parts {
        match seg.split(';').next().unwrap_or("") {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    format!("/{}", out.join("/"))
}

/// The endpoint group a POST to this path reaches (None: not an endpoint).
fn group(path: &str) -> Option<Group> {
    match classify(&http::Method::POST, path) {
        Target::Proxy(e) => Some(e.group),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn a_path_taken_as_written_names_the_same_endpoint_to_any_upstream(
        base in prop::sample::select(PATHS),
        edits in prop::collection::vec(edit(), 0..4),
    ) {
        let path = apply(base, &edits);
        // Most spellings are refused (a 400); the rest must be the path itself.
        if !canonical(&path) {
            return Ok(());
        }
        let here = group(&path);
        for there in normalisations(&path) {
            let upstream = group(&there);
            // `other` forwards any path with a model in its body: an upstream reading it as
            // one of the API's own endpoints would be the alias this guards against.
            let alias = match (here, upstream) {
                (Some(Group::Other), Some(g)) => g != Group::Other,
                (Some(h), Some(g)) => h != g,
                (Some(_), None) | (None, _) => false,
            };
            prop_assert!(!alias, "{path:?} is {here:?} here, {upstream:?} as {there:?}");
        }
    }
}
