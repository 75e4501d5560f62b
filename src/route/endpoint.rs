//! Route stage, first step: which contract endpoint a method + path is, its permission group,
//! and how its body names the model (JSON field or multipart form field).

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
}

impl Group {
    pub const ALL: [Group; 8] = [
        Group::Chat,
        Group::Embeddings,
        Group::Moderations,
        Group::Images,
        Group::Audio,
        Group::Models,
        Group::Usage,
        Group::Other,
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
        }
    }

    pub fn parse(s: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == s)
    }

    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// How the request body carries `model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    Json,
    /// multipart/form-data (audio uploads, image edits); some image paths also accept JSON.
    MultipartOrJson,
}

/// A proxied `/v1` endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub group: Group,
    pub body: BodyKind,
}

/// What a request is, decided from method and path alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Proxy(Endpoint),
    ListModels,
    GetModel(String),
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
    if method == http::Method::GET {
        if path == "/v1/models" {
            return Target::ListModels;
        }
        if let Some(id) = path.strip_prefix("/v1/models/") {
            return Target::GetModel(id.to_string());
        }
    } else if models {
        return Target::WrongMethod("GET");
    }
    let ep = |group, body| Target::Proxy(Endpoint { group, body });
    let target = match path {
        "/v1/chat/completions" | "/v1/completions" => ep(Chat, Json),
        "/v1/embeddings" => ep(Embeddings, Json),
        "/v1/moderations" => ep(Moderations, Json),
        "/v1/images/generations" => ep(Images, Json),
        "/v1/images/edits" | "/v1/images/variations" => ep(Images, MultipartOrJson),
        "/v1/audio/transcriptions" | "/v1/audio/translations" => ep(Audio, MultipartOrJson),
        "/v1/audio/speech" => ep(Audio, Json),
        // Routed by the model its body names; a body that names none makes it a 404.
        p if p.starts_with("/v1/") && method == http::Method::POST => ep(Other, Json),
        _ => Target::Other,
    };
    match target {
        Target::Proxy(_) if method != http::Method::POST => Target::WrongMethod("POST"),
        t => t,
    }
}

#[cfg(test)]
mod tests {
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
            Target::WrongMethod("GET")
        );
        assert_eq!(classify(&Method::GET, "/v1/nope"), Target::Other);
        assert_eq!(
            classify(&Method::POST, "/v1/rerank"),
            Target::Proxy(Endpoint {
                group: Group::Other,
                body: BodyKind::Json
            })
        );
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
