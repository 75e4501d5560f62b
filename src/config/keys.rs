//! Keys file: parse → validate → `KeyTable`, a lookup by SHA-256 of the secret. The whole
//! schema of the contract loads here; later stages enforce permissions, limits and budgets.
//! Secrets are hashed on load and never kept in clear.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use toml::Spanned;

use super::problem::line_of;
use super::{Problem, Problems};

/// The `models` allow-list: everything, or globs.
#[derive(Debug)]
pub enum ModelFilter {
    All,
    Globs(GlobSet),
}

#[derive(Debug)]
pub struct Key {
    pub id: String,
    pub sha256: [u8; 32],
    pub model_patterns: Vec<String>,
    pub models: ModelFilter,
    /// Bit set of `Group::bit()`.
    pub endpoints: u16,
    pub rpm: Option<u32>,
    pub tpm: Option<u64>,
    pub max_concurrent: Option<u32>,
    pub budget: Option<f64>,
    /// The model for ids no model entry matches (before `[routing] default_model`).
    pub default_model: Option<String>,
    pub disabled: bool,
    /// Unix seconds.
    pub expires_at: Option<i64>,
    /// The start and last 4 characters of the secret, for people to tell keys apart; None when
    /// only its SHA-256 is known.
    pub hint: Option<String>,
    /// The client (`throttle::client_id`) that last used this key: while that address is
    /// throttled for wrong keys, a key it already used goes on working (0: none yet).
    pub last_client: std::sync::atomic::AtomicU64,
    /// Its requests in flight (each holds a `limit::rate::Slot`), for `max_concurrent`.
    pub in_flight: Arc<std::sync::atomic::AtomicU32>,
}

impl Key {
    pub fn may_use_model(&self, model: &str) -> bool {
        match &self.models {
            ModelFilter::All => true,
            ModelFilter::Globs(g) => g.is_match(model),
        }
    }
    pub fn may_use(&self, group: Group) -> bool {
        self.endpoints & group.bit() != 0
    }
    pub fn is_live(&self, now_unix: i64) -> bool {
        !self.disabled && self.expires_at.is_none_or(|t| now_unix < t)
    }
}

/// The live key table: one immutable snapshot, swapped whole on reload.
#[derive(Debug, Default)]
pub struct KeyTable {
    by_hash: HashMap<[u8; 32], Arc<Key>, foldhash::fast::RandomState>,
}

impl KeyTable {
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }
    /// The SHA-256 of every key's secret.
    pub fn hashes(&self) -> impl Iterator<Item = &[u8; 32]> {
        self.by_hash.keys()
    }
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
    /// What the keys of `before` learned while in force, kept by the same keys here (a key's
    /// `last_client`: a reload must not lock a key out behind a throttled address).
    /// Matched by id, so a rotated secret keeps them too; also its count of requests in flight,
    /// so a `max_concurrent` the reload adds counts the requests already running.
    pub fn carry_over(&mut self, before: &KeyTable) {
        use std::sync::atomic::Ordering::Relaxed;
        let by_id: HashMap<&str, &Arc<Key>> = before
            .by_hash
            .values()
            .map(|k| (k.id.as_str(), k))
            .collect();
        for key in self.by_hash.values_mut() {
            let Some(old) = by_id.get(key.id.as_str()) else {
                continue;
            };
            // The table is new: each key has no other owner yet.
            if let Some(key) = Arc::get_mut(key) {
                key.last_client = old.last_client.load(Relaxed).into();
                key.in_flight = old.in_flight.clone();
            }
        }
    }

    pub fn get_by_hash(&self, h: &[u8; 32]) -> Option<&Arc<Key>> {
        self.by_hash.get(h)
    }
    pub fn keys(&self) -> impl Iterator<Item = &Arc<Key>> {
        self.by_hash.values()
    }

    pub fn load(path: &Path) -> Result<KeyTable, Problems> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Problems::one(Problem::new(&file, None, "", format!("cannot read: {e}")))
        })?;
        Self::parse(&file, &text)
    }

    pub fn parse(file: &str, text: &str) -> Result<KeyTable, Problems> {
        let (raw, mut p) = super::problem::deserialize_all::<RawKeysFile>(file, text);
        let Some(raw) = raw else { return Err(p) };
        let shape = p.0.len();
        let mut by_hash = HashMap::with_capacity_and_hasher(raw.keys.len(), Default::default());
        let mut ids = HashSet::with_capacity(raw.keys.len());
        for (i, rk) in raw.keys.into_iter().enumerate() {
            let mut c = KeyCheck {
                file,
                text,
                i,
                p: &mut p,
            };
            let id = rk.id.get_ref().clone();
            if id.is_empty() || !ids.insert(id.clone()) {
                c.problem(rk.id.span(), "id", format!("duplicate or empty id '{id}'"));
            }
            let Some(key) = c.key(rk, id) else { continue };
            if let Some(span) = by_hash.insert(key.0.sha256, key.0).and(Some(key.1)) {
                c.problem(span, "secret", "the same secret is used by another key");
            }
        }
        p.after_shape(shape).into_result(KeyTable { by_hash })
    }
}

/// One `[[keys]]` table of a keys file being checked: where its problems go.
struct KeyCheck<'a> {
    file: &'a str,
    text: &'a str,
    /// Its index, for the problems' field names (`keys[3].rpm`).
    i: usize,
    p: &'a mut Problems,
}

impl KeyCheck<'_> {
    fn problem(&mut self, span: std::ops::Range<usize>, name: &str, m: impl Into<String>) {
        let line = Some(line_of(self.text, span.start));
        let field = format!("keys[{}].{name}", self.i);
        self.p.push(Problem::new(self.file, line, &field, m));
    }

    /// The key, with the span of its id (for a secret another key has too); None when its
    /// secret is missing or not valid. Every other problem is noted and the key still made.
    fn key(&mut self, rk: RawKey, id: String) -> Option<(Arc<Key>, std::ops::Range<usize>)> {
        let sha256 = self.sha256(&rk);
        let (model_patterns, models) = self.models(rk.models.unwrap_or_default());
        let endpoints = self.endpoints(rk.endpoints.as_deref());
        let expires_at = rk.expires_at.as_ref().and_then(|v| {
            let t = parse_time(v.get_ref());
            if t.is_none() {
                let m = "must be an RFC 3339 time, e.g. 2027-01-01T00:00:00Z";
                self.problem(v.span(), "expires_at", m);
            }
            t
        });
        // A limit of 0 would refuse every request: `disabled = true` says that.
        let zero = |v: Option<Spanned<u64>>| v.filter(|v| *v.get_ref() == 0).map(|v| v.span());
        let widen = |v: &Option<Spanned<u32>>| {
            v.as_ref()
                .map(|v| Spanned::new(v.span(), u64::from(*v.get_ref())))
        };
        for (name, span) in [
            ("rpm", zero(widen(&rk.rpm))),
            ("tpm", zero(rk.tpm.clone())),
            ("max_concurrent", zero(widen(&rk.max_concurrent))),
        ] {
            if let Some(span) = span {
                let m =
                    "must be at least 1 (leave it out for no limit; `disabled = true` stops a key)";
                self.problem(span, name, m);
            }
        }
        if let Some(b) = rk
            .budget
            .as_ref()
            .filter(|b| !b.get_ref().is_finite() || *b.get_ref() < 0.0)
        {
            self.problem(b.span(), "budget", "must be a number >= 0");
        }
        let hint = match &rk.secret {
            Some(s) => Some(secret_hint(s.get_ref())),
            None => rk.secret_hint.clone(),
        };
        let key = Key {
            id,
            sha256: sha256?,
            model_patterns,
            models,
            endpoints,
            rpm: rk.rpm.as_ref().map(|v| *v.get_ref()),
            tpm: rk.tpm.as_ref().map(|v| *v.get_ref()),
            max_concurrent: rk.max_concurrent.as_ref().map(|v| *v.get_ref()),
            budget: rk.budget.map(Spanned::into_inner),
            default_model: rk.default_model.clone(),
            disabled: rk.disabled,
            expires_at,
            hint,
            last_client: Default::default(),
            in_flight: Default::default(),
        };
        Some((Arc::new(key), rk.id.span()))
    }

    /// The SHA-256 of the key's secret: of `secret`, or `secret_sha256` as given.
    fn sha256(&mut self, rk: &RawKey) -> Option<[u8; 32]> {
        match (&rk.secret, &rk.secret_sha256) {
            (Some(s), None) if s.get_ref().len() >= 8 => Some(sha256(s.get_ref().as_bytes())),
            (Some(s), None) => {
                self.problem(s.span(), "secret", "must be at least 8 characters");
                None
            }
            (None, Some(h)) => {
                let mut out = [0u8; 32];
                let decoded = hex::decode_to_slice(h.get_ref().trim(), &mut out);
                if decoded.is_err() {
                    self.problem(h.span(), "secret_sha256", "must be 64 hex characters");
                }
                decoded.ok().map(|()| out)
            }
            (Some(s), Some(_)) => {
                let m = "give `secret` or `secret_sha256`, not both";
                self.problem(s.span(), "secret", m);
                None
            }
            (None, None) => {
                let m = "needs `secret` or `secret_sha256`";
                self.problem(rk.id.span(), "secret", m);
                None
            }
        }
    }

    /// The model patterns as written (`*` when none) and their matcher.
    fn models(&mut self, patterns: Vec<Spanned<String>>) -> (Vec<String>, ModelFilter) {
        let model_patterns: Vec<String> = if patterns.is_empty() {
            vec!["*".to_string()]
        } else {
            patterns.iter().map(|p| p.get_ref().clone()).collect()
        };
        let mut globs = Vec::with_capacity(patterns.len());
        for pat in &patterns {
            match Glob::new(pat.get_ref()) {
                Ok(g) => globs.push(g),
                Err(e) => {
                    let m = format!("bad glob '{}': {e}", pat.get_ref());
                    self.problem(pat.span(), "models", m);
                }
            }
        }
        let models = if model_patterns.iter().any(|p| p == "*") {
            // The common case needs no matcher: building a GlobSet per key would dominate
            // loading 100,000 keys.
            ModelFilter::All
        } else {
            let mut gs = GlobSetBuilder::new();
            for g in globs {
                gs.add(g);
            }
            ModelFilter::Globs(gs.build().unwrap_or_else(|_| GlobSet::empty()))
        };
        (model_patterns, models)
    }

    /// The endpoint groups' bits (every group when the key names none).
    fn endpoints(&mut self, list: Option<&[Spanned<String>]>) -> u16 {
        let Some(list) = list else {
            return Group::ALL.iter().fold(0, |acc, g| acc | g.bit());
        };
        list.iter()
            .fold(0, |acc, e| match Group::parse(e.get_ref()) {
                Some(g) => acc | g.bit(),
                None => {
                    let m = format!(
                        "unknown endpoint group '{}' (one of {})",
                        e.get_ref(),
                        Group::ALL.map(|g| g.name()).join(", ")
                    );
                    self.problem(e.span(), "endpoints", m);
                    acc
                }
            })
    }
}

/// A fresh key: `sk-` + 48 url-safe characters (36 random bytes).
pub fn new_secret() -> String {
    use base64::Engine;
    let bytes: [u8; 36] = rand::random();
    format!(
        "sk-{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// `sk-AbCd…wxyz` for a long secret: enough to tell keys apart, far too little to guess one.
/// A shorter (hand-written) secret shows only its last 4 characters, or nothing.
pub fn secret_hint(secret: &str) -> String {
    let chars: Vec<char> = secret.chars().collect();
    let tail: String = chars[chars.len().saturating_sub(4)..].iter().collect();
    match chars.len() {
        32.. => format!("{}…{tail}", chars[..7].iter().collect::<String>()),
        16..=31 => format!("…{tail}"),
        _ => "…".into(),
    }
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// `expires_at` as a TOML string or a TOML datetime.
fn parse_time(v: &toml::Value) -> Option<i64> {
    let s = match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Datetime(d) => d.to_string(),
        _ => return None,
    };
    time::OffsetDateTime::parse(&s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeysFile {
    #[serde(default)]
    keys: Vec<RawKey>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    id: Spanned<String>,
    secret: Option<Spanned<String>>,
    secret_sha256: Option<Spanned<String>>,
    /// What the console shows of a secret it created: `sk-AbCd…wxyz`.
    secret_hint: Option<String>,
    models: Option<Vec<Spanned<String>>>,
    endpoints: Option<Vec<Spanned<String>>>,
    rpm: Option<Spanned<u32>>,
    tpm: Option<Spanned<u64>>,
    max_concurrent: Option<Spanned<u32>>,
    budget: Option<Spanned<f64>>,
    default_model: Option<String>,
    #[serde(default)]
    disabled: bool,
    expires_at: Option<Spanned<toml::Value>>,
}

/// The endpoint groups a key's `endpoints` name (a path's group: `route::endpoint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    Chat,
    Embeddings,
    Moderations,
    Images,
    Audio,
    Models,
    Usage,
    /// Any other model-server `POST /v1/...` whose body names a model (vLLM's `/v1/rerank`,
    /// `/v1/score`, `/v1/tokenize`, …).
    Other,
    /// The Responses API: `/v1/responses` and the stored responses it names by id.
    Responses,
    /// Anthropic's Messages API: `/v1/messages` and `/v1/messages/count_tokens`.
    Messages,
}

impl Group {
    pub const ALL: [Group; 10] = [
        Group::Chat,
        Group::Embeddings,
        Group::Moderations,
        Group::Images,
        Group::Audio,
        Group::Models,
        Group::Usage,
        Group::Other,
        Group::Responses,
        Group::Messages,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::Chat => "chat",
            Group::Embeddings => "embeddings",
            Group::Moderations => "moderations",
            Group::Images => "images",
            Group::Audio => "audio",
            Group::Models => "models",
            Group::Usage => "usage",
            Group::Other => "other",
            Group::Responses => "responses",
            Group::Messages => "messages",
        }
    }

    pub fn parse(s: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == s)
    }

    pub fn bit(self) -> u16 {
        1 << (self as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_example_loads() {
        let text = r#"
[[keys]]
id = "demo"
secret = "sk-demo-0123456789"
models = ["echo-*"]
endpoints = ["chat", "embeddings", "moderations", "images", "audio", "models", "usage"]
rpm = 600
tpm = 200000
max_concurrent = 20
budget = 100.0
disabled = false
expires_at = "2027-01-01T00:00:00Z"

[[keys]]
id = "hashed"
secret_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
endpoints = ["models"]
"#;
        let t = KeyTable::parse("keys.toml", text).expect("valid");
        assert_eq!(t.len(), 2);
        let k = t.get_by_hash(&sha256(b"sk-demo-0123456789")).expect("demo");
        assert!(k.may_use_model("echo-1") && !k.may_use_model("gpt-4"));
        assert!(k.is_live(0) && !k.is_live(1_900_000_000));
        let h = t.get_by_hash(&sha256(b"test")).expect("hashed");
        assert!(h.may_use(Group::Models) && !h.may_use(Group::Chat));
    }

    #[test]
    fn every_problem_is_named_with_line_and_field() {
        let text = r#"
[[keys]]
id = "a"
secret = "sk-aaaaaaaaaa"
endpoints = ["chat", "files"]
models = ["[bad"]

[[keys]]
id = "a"
secret = "sk-aaaaaaaaaa"
rpm = 0
tpm = 0
max_concurrent = 0
"#;
        let e = KeyTable::parse("keys.toml", text).expect_err("invalid");
        let s = e.to_string();
        assert!(s.contains("keys.toml:5: keys[0].endpoints"), "{s}");
        assert!(s.contains("keys.toml:6: keys[0].models"), "{s}");
        assert!(s.contains("keys.toml:9: keys[1].id"), "{s}");
        assert!(s.contains("same secret"), "{s}");
        // A limit of 0 would refuse every request.
        for (line, field) in [(11, "rpm"), (12, "tpm"), (13, "max_concurrent")] {
            assert!(
                s.contains(&format!(
                    "keys.toml:{line}: keys[1].{field}: must be at least 1"
                )),
                "{s}"
            );
        }
    }

    #[test]
    fn an_unknown_field_is_refused() {
        let e = KeyTable::parse("k.toml", "[[keys]]\nid='a'\nsecret='sk-12345678'\nrmp=5\n")
            .expect_err("typo");
        assert!(e.to_string().contains("k.toml:4"), "{e}");
    }
}
