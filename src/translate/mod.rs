//! Translate stage: a request in one API for a pool that speaks another, and its reply back.
//! Every API is read into and written from one neutral form (`ir`); a reply is translated as
//! it comes (a stream event by event, a plain reply once whole). The meter reads the
//! provider's own bytes before they are translated, so usage is the provider's. Uses `config`
//! (the pool's provider) and `error`.

pub mod chat;
pub mod errors;
pub mod ir;
pub mod messages;
pub mod sse;

use bytes::Bytes;
use pingora_http::ResponseHeader;

pub use crate::config::Api;
use crate::config::{PoolConfig, Provider};
use crate::error::GatewayError;
use ir::{Collect, Event};

/// A 400 naming the parameter.
pub(crate) fn bad(param: &'static str, message: String) -> GatewayError {
    GatewayError::InvalidParameter { param, message }
}

/// A request field the provider has no equivalent of (never dropped in silence).
pub(crate) fn unsupported(name: &str) -> GatewayError {
    /// OpenAI's request fields the translation has no equivalent for (named as the `param`).
    const KNOWN: &[&str] = &[
        "temperature",
        "top_p",
        "top_k",
        "n",
        "response_format",
        "modalities",
        "audio",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "prediction",
        "web_search_options",
        "functions",
        "function_call",
        "verbosity",
    ];
    match KNOWN.iter().find(|k| **k == name) {
        Some(param) => GatewayError::Unsupported {
            param,
            message: format!(
                "'{param}' has no equivalent in the API of this model's provider, so it \
                 cannot be honoured."
            ),
        },
        None => GatewayError::InvalidParameter {
            param: "body",
            message: format!("Unrecognized request argument supplied: {name}"),
        },
    }
}

/// What a request is translated from and to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub from: Api,
    pub to: Api,
}

impl Plan {
    /// Where the translated request goes.
    pub fn path(self) -> &'static str {
        match self.to {
            Api::Messages => "/v1/messages",
            _ => "/v1/chat/completions",
        }
    }
}

/// How a request of `api` (None: a path of no named API) reaches `pool`: as it is (None), or
/// translated; an API the pool cannot take at all is the client's 400.
pub fn plan(api: Option<Api>, pool: &PoolConfig) -> Result<Option<Plan>, GatewayError> {
    let refused = |what: &str| GatewayError::Unsupported {
        param: "model",
        message: format!(
            "This model is served by a {} pool ('{}'), which does not take {what}.",
            pool.provider.name(),
            pool.name
        ),
    };
    match (pool.provider, api) {
        (Provider::OpenAi, None) => Ok(None),
        (Provider::OpenAi, Some(Api::Chat)) => Ok(None),
        (_, Some(a)) if pool.native.passes(a) => Ok(None),
        (Provider::OpenAi, Some(from @ (Api::Responses | Api::Messages))) => Ok(Some(Plan {
            from,
            to: Api::Chat,
        })),
        (Provider::Anthropic, Some(from @ (Api::Chat | Api::Responses | Api::Messages))) => {
            Ok(Some(Plan {
                from,
                to: Api::Messages,
            }))
        }
        (_, Some(a)) => Err(refused(&format!("the {} API", a.name()))),
        (_, None) => Err(refused("this path")),
    }
}

/// The request as the translation needs it.
pub struct Asked<'a> {
    pub body: &'a [u8],
    /// The model's name upstream.
    pub model: &'a str,
    /// The most output the request may ask for (its budget's reservation).
    pub cap: Option<u64>,
    /// The output asked for when the request names none (a provider that requires it).
    pub default_max_tokens: u64,
}

/// The translated request body and the translation of its reply.
pub fn request(plan: Plan, asked: &Asked<'_>) -> Result<(Bytes, Translation), GatewayError> {
    let conversation = match plan.from {
        Api::Chat => chat::read_request(asked.body)?,
        other => return Err(not_yet(plan, other)),
    };
    let max_tokens = conversation
        .max_tokens
        .unwrap_or(asked.default_max_tokens)
        .min(asked.cap.unwrap_or(u64::MAX))
        .max(1);
    let body = match plan.to {
        Api::Messages => messages::write_request(&conversation, asked.model, max_tokens)?,
        other => return Err(not_yet(plan, other)),
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let t = Translation {
        plan,
        stream: conversation.stream,
        body: Body::Unknown,
        out: chat::StreamOut::new(created, conversation.include_usage),
        collect: Collect::default(),
        created,
    };
    Ok((Bytes::from(body), t))
}

fn not_yet(plan: Plan, api: Api) -> GatewayError {
    GatewayError::Unsupported {
        param: "model",
        message: format!(
            "Translating the {} API to the {} API is not supported yet ({}).",
            plan.from.name(),
            plan.to.name(),
            api.name()
        ),
    }
}

/// The reply's body as it is read.
#[derive(Debug)]
enum Body {
    /// Before the header.
    Unknown,
    /// Events, read as they come.
    Events {
        reader: sse::Reader,
        decoder: messages::StreamIn,
    },
    /// A plain reply, held until whole.
    Whole(Vec<u8>),
}

/// The translation of one reply: it reads the provider's and writes the client's API.
#[derive(Debug)]
pub struct Translation {
    plan: Plan,
    /// The client asked for a stream.
    stream: bool,
    body: Body,
    out: chat::StreamOut,
    /// A stream read for a client that asked for a plain reply.
    collect: Collect,
    created: u64,
}

/// The largest plain reply translated.
const MAX_WHOLE: usize = 64 * 1024 * 1024;

impl Translation {
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// A success's header: what its body will be, in the client's API.
    pub fn on_header(&mut self, resp: &mut ResponseHeader) -> pingora_error::Result<()> {
        let events = resp
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        self.body = if events {
            Body::Events {
                reader: sse::Reader::default(),
                decoder: messages::StreamIn::default(),
            }
        } else {
            Body::Whole(Vec::new())
        };
        let content_type = if self.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        resp.insert_header(http::header::CONTENT_TYPE, content_type)?;
        if self.stream {
            resp.insert_header(http::header::CACHE_CONTROL, "no-cache")?;
        }
        // Its length changes; and what is translated is the decoded body.
        resp.remove_header(&http::header::CONTENT_LENGTH);
        resp.remove_header(&http::header::CONTENT_ENCODING);
        Ok(())
    }

    /// One piece of the provider's body: the client's bytes in its place.
    pub fn feed(&mut self, piece: Option<&[u8]>, end: bool) -> Bytes {
        let mut events = Vec::new();
        match &mut self.body {
            Body::Events { reader, decoder } => {
                let mut read = Vec::new();
                if let Some(p) = piece {
                    if reader.feed(p, &mut read).is_err() {
                        events.push(too_large());
                    }
                }
                if end {
                    reader.finish(&mut read);
                }
                for e in read {
                    decoder.event(&e.data, &mut events);
                }
            }
            Body::Whole(buf) => {
                if let Some(p) = piece {
                    buf.extend_from_slice(p);
                }
                if buf.len() > MAX_WHOLE {
                    buf.clear();
                    events.push(too_large());
                } else if end {
                    events = match messages::read_reply(buf) {
                        Some(r) => r.events(),
                        None => vec![Event::Error {
                            kind: "api_error".into(),
                            message: "The provider's reply could not be read.".into(),
                        }],
                    };
                }
            }
            Body::Unknown => {}
        }
        let mut out = Vec::new();
        for e in events {
            if self.stream {
                self.out.event(e, &mut out);
            } else {
                self.collect.push(e);
            }
        }
        if !self.stream && end {
            out = match self.collect.error.take() {
                Some((kind, message)) => errors::openai_error(&kind, &message)
                    .to_string()
                    .into_bytes(),
                None => chat::write_reply(&self.collect.reply, self.created),
            };
        }
        Bytes::from(out)
    }

    /// An error reply from the provider, in the client's shape: its status and body.
    pub fn error(&self, status: u16, body: &[u8]) -> Option<(u16, Vec<u8>)> {
        let translated = errors::anthropic_to_openai(body)?;
        Some((errors::openai_status(status), translated))
    }
}

fn too_large() -> Event {
    Event::Error {
        kind: "api_error".into(),
        message: "The provider's reply is too large to translate.".into(),
    }
}

#[cfg(test)]
mod tests;
