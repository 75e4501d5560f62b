//! Route stage, first step: which contract endpoint a method + path is, its permission group,
//! how its body names the model (JSON field or multipart form field), how its reply is
//! metered, and which API's error shape it speaks.

pub use crate::config::Api;
pub use crate::config::keys::Group;

/// How the request body carries `model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    Json,
    /// multipart/form-data (audio uploads, image edits); some image paths also accept JSON.
    MultipartOrJson,
}

/// How an endpoint's reply is metered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metering {
    /// Chat and legacy completions: `usage` of a plain reply, or the stream's events (usage
    /// asked for when the client did not ask).
    Chat,
    /// A plain reply's `usage`, estimated when missing (embeddings, moderations).
    Usage,
    /// A plain reply's `usage` when it has one, never estimated (other model-server paths).
    Reported,
    /// The Responses API: `usage` of the reply or of `response.completed`.
    Responses,
    /// Anthropic Messages: `usage` of the reply, or `message_start` + `message_delta`.
    Messages,
    /// No tokens: priced per request (images, audio).
    PerRequest,
    /// No tokens and no price: it spends nothing (token counting, stored-response calls).
    Free,
}

/// A proxied `/v1` endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub group: Group,
    pub body: BodyKind,
    pub metering: Metering,
    /// The API it belongs to (what a pool passes through or has translated); None for a
    /// path of no named API (`other`).
    pub api: Option<Api>,
}

/// What a request is, decided from method and path alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Proxy(Endpoint),
    ListModels,
    GetModel(String),
    /// `/v1/responses/{id}` (GET, DELETE) and its `/input_items` (GET), `/cancel` (POST):
    /// passed to the upstream that made the response.
    StoredResponse(String),
    /// A known path with a method it does not take → 405 with `Allow`.
    WrongMethod(&'static str),
    /// Unknown here → 404.
    Other,
}

pub fn classify(method: &http::Method, path: &str) -> Target {
    use BodyKind::*;
    use Group::*;
    let path = path.split('?').next().unwrap_or(path);
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    let models = path == "/v1/models" || path.starts_with("/v1/models/");
    // HEAD is GET without the body (RFC 9110 §9.3.2): a monitor's probe.
    if method == http::Method::GET || method == http::Method::HEAD {
        if path == "/v1/models" {
            return Target::ListModels;
        }
        if let Some(id) = path.strip_prefix("/v1/models/") {
            // SDKs encode the id as one path segment (`org%2Fmodel`).
            return Target::GetModel(
                percent_encoding::percent_decode_str(id)
                    .decode_utf8_lossy()
                    .into_owned(),
            );
        }
    } else if models {
        return Target::WrongMethod("GET, HEAD");
    }
    if let Some(rest) = path.strip_prefix("/v1/responses/") {
        return stored_response(method, rest);
    }
    let ep = |group, body, metering, api| {
        Target::Proxy(Endpoint {
            group,
            body,
            metering,
            api,
        })
    };
    let target = match path {
        "/v1/chat/completions" => ep(Chat, Json, Metering::Chat, Some(Api::Chat)),
        "/v1/completions" => ep(Chat, Json, Metering::Chat, Some(Api::Completions)),
        "/v1/embeddings" => ep(Embeddings, Json, Metering::Usage, Some(Api::Embeddings)),
        "/v1/moderations" => ep(Moderations, Json, Metering::Usage, Some(Api::Moderations)),
        "/v1/images/generations" => ep(Images, Json, Metering::PerRequest, Some(Api::Images)),
        "/v1/images/edits" | "/v1/images/variations" => ep(
            Images,
            MultipartOrJson,
            Metering::PerRequest,
            Some(Api::Images),
        ),
        "/v1/audio/transcriptions" | "/v1/audio/translations" => ep(
            Audio,
            MultipartOrJson,
            Metering::PerRequest,
            Some(Api::Audio),
        ),
        "/v1/audio/speech" => ep(Audio, Json, Metering::PerRequest, Some(Api::Audio)),
        "/v1/responses" => ep(Responses, Json, Metering::Responses, Some(Api::Responses)),
        "/v1/messages" => ep(Messages, Json, Metering::Messages, Some(Api::Messages)),
        "/v1/messages/count_tokens" => ep(Messages, Json, Metering::Free, Some(Api::Messages)),
        // Routed by the model its body names; a body that names none makes it a 404.
        p if p.starts_with("/v1/") && method == http::Method::POST => {
            ep(Other, Json, Metering::Reported, None)
        }
        _ => Target::Other,
    };
    match target {
        Target::Proxy(_) if method != http::Method::POST => Target::WrongMethod("POST"),
        t => t,
    }
}

/// Whether a path is written as the API names it: no percent-encoded unreserved character,
/// `/`, `\\`, `;` or control character; none of those raw but `/`; no empty, `.` or `..` segment;
/// and not one of the API's paths in other letter case. Each of those is another spelling of a
/// path to some upstream server (which decodes, normalises, drops `;` parameters or ignores
/// case), while the gateway classifies the bytes: `/v1/chat%2Fcompletions` would be `other`
/// here and chat there, a stream then metered as neither, and a key allowed only `other`
/// would reach chat.
pub fn canonical(path: &str) -> bool {
    let b = path.as_bytes();
    let odd = |c: u8| c == b';' || c == b'\\' || c < 0x20 || c == 0x7f;
    let encoded_alias = b.windows(3).any(|w| {
        w[0] == b'%'
            && std::str::from_utf8(&w[1..])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .is_some_and(|c| c.is_ascii_alphanumeric() || b"-._~/".contains(&c) || odd(c))
    });
    let odd_segment = path.contains("//")
        || path.split('/').any(|seg| matches!(seg, "." | ".."))
        || b.iter().any(|c| odd(*c));
    let case_alias = b.iter().any(u8::is_ascii_uppercase)
        && matches!(
            classify(&http::Method::POST, &path.to_ascii_lowercase()),
            Target::Proxy(Endpoint { group, .. }) if group != Group::Other
        );
    !encoded_alias && !odd_segment && !case_alias
}

/// `/v1/responses/{id}[/input_items|/cancel]` by method.
fn stored_response(method: &http::Method, rest: &str) -> Target {
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if id.is_empty() {
        return Target::Other;
    }
    let allowed = match tail {
        "" => "GET, DELETE",
        "input_items" => "GET",
        "cancel" => "POST",
        _ => return Target::Other,
    };
    if allowed.split(", ").any(|m| m == method.as_str()) {
        Target::StoredResponse(id.to_string())
    } else {
        Target::WrongMethod(allowed)
    }
}

/// The API a request speaks, for its errors (and its key header): Anthropic's on the Messages
/// API, and on the model list when an Anthropic client asks (it sent `anthropic-version`, as
/// Anthropic's SDKs always do; looked up on that path only); else OpenAI's.
pub fn error_shape(path: &str, headers: &http::HeaderMap) -> crate::error::ErrorShape {
    let messages = path == "/v1/messages" || path.starts_with("/v1/messages/");
    let models = || path == "/v1/models" || path.starts_with("/v1/models/");
    if messages || (models() && headers.contains_key("anthropic-version")) {
        crate::error::ErrorShape::Anthropic
    } else {
        crate::error::ErrorShape::OpenAi
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn only_the_api_spelling_of_a_path_is_canonical() {
        for ok in [
            "/v1/chat/completions",
            "/v1/chat/completions/",
            "/v1/Rerank",
            "/v1/responses/resp_1",
            "/v1/x/caf%C3%A9",
            "/v1/x/a%20b",
            "/v1/x/a.b",
        ] {
            assert!(canonical(ok), "{ok}");
        }
        for alias in [
            "/v1/chat%2Fcompletions",
            "/v1/chat%2fcompletions",
            "/v1/%63hat/completions",
            "/v1/chat/completion%73",
            "/v1//chat/completions",
            "/v1/x/../chat/completions",
            "/v1/./chat/completions",
            "/v1/chat/completions/..",
            "/v1/%2E%2E/v1/chat/completions",
            "/v1/a%7Eb",
            "/v1/chat/completions;x",
            "/v1/chat%3Bcompletions",
            "/v1/chat%5Ccompletions",
            "/v1/chat\\completions",
            "/v1/chat/completions%00",
            "/v1/Chat/Completions",
            "/V1/CHAT/COMPLETIONS",
        ] {
            assert!(!canonical(alias), "{alias}");
        }
    }

    use super::*;
    use http::Method;

    #[test]
    fn every_contract_path_has_its_group() {
        let cases = [
            ("/v1/chat/completions", Group::Chat),
            ("/v1/completions", Group::Chat),
            ("/v1/embeddings", Group::Embeddings),
            ("/v1/moderations", Group::Moderations),
            ("/v1/images/generations", Group::Images),
            ("/v1/images/edits", Group::Images),
            ("/v1/images/variations", Group::Images),
            ("/v1/audio/transcriptions", Group::Audio),
            ("/v1/audio/translations", Group::Audio),
            ("/v1/audio/speech", Group::Audio),
            ("/v1/responses", Group::Responses),
            ("/v1/messages", Group::Messages),
            ("/v1/messages/count_tokens", Group::Messages),
        ];
        for (path, group) in cases {
            match classify(&Method::POST, path) {
                Target::Proxy(e) => assert_eq!(e.group, group, "{path}"),
                other => panic!("{path}: {other:?}"),
            }
        }
        assert_eq!(classify(&Method::GET, "/v1/models"), Target::ListModels);
        assert_eq!(
            classify(&Method::GET, "/v1/models/a/b"),
            Target::GetModel("a/b".into())
        );
        assert_eq!(
            classify(&Method::GET, "/v1/chat/completions"),
            Target::WrongMethod("POST")
        );
        assert_eq!(
            classify(&Method::DELETE, "/v1/models/x"),
            Target::WrongMethod("GET, HEAD")
        );
        assert_eq!(classify(&Method::GET, "/v1/nope"), Target::Other);
        assert_eq!(
            classify(&Method::POST, "/v1/rerank"),
            Target::Proxy(Endpoint {
                group: Group::Other,
                body: BodyKind::Json,
                metering: Metering::Reported,
                api: None,
            })
        );
        assert_eq!(
            classify(&Method::DELETE, "/v1/responses/resp_1"),
            Target::StoredResponse("resp_1".into())
        );
        assert_eq!(
            classify(&Method::GET, "/v1/responses/resp_1/input_items"),
            Target::StoredResponse("resp_1".into())
        );
        assert_eq!(
            classify(&Method::POST, "/v1/responses/resp_1"),
            Target::WrongMethod("GET, DELETE")
        );
        assert_eq!(
            classify(&Method::GET, "/v1/responses"),
            Target::WrongMethod("POST")
        );
        assert_eq!(classify(&Method::GET, "/v1/responses/a/b"), Target::Other);
        assert_eq!(classify(&Method::GET, "/v1/rerank"), Target::Other);
        assert_eq!(classify(&Method::POST, "/v2/rerank"), Target::Other);
    }

    #[test]
    fn group_names_round_trip() {
        for g in Group::ALL {
            assert_eq!(Group::parse(g.name()), Some(g));
        }
        assert_eq!(Group::parse("files"), None);
    }
}
