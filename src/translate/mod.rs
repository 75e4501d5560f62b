//! Translate stage: a request in one API for a pool that speaks another, and its reply back.
//! Every API is read into and written from one neutral form (`ir`); a reply is translated as
//! it comes (a stream event by event, a plain reply once whole). The meter reads the
//! provider's own bytes before they are translated, so usage is the provider's. Uses `config`
//! (the pool's provider) and `error`.

pub mod chat;
pub mod chat_reply;
pub mod errors;
pub mod ir;
pub mod messages;
pub mod messages_reply;
mod reply;
pub mod responses;
pub mod responses_reply;
pub mod sse;

use bytes::Bytes;

pub use crate::config::Api;
use crate::config::{PoolConfig, Provider};
use crate::error::GatewayError;
pub use reply::Translation;

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
        Api::Messages => messages::read_request(asked.body)?,
        Api::Responses => responses::read_request(asked.body)?,
        other => return Err(not_yet(plan, other)),
    };
    let asked_for = match (conversation.max_tokens, asked.cap) {
        (Some(n), Some(cap)) => Some(n.min(cap)),
        (n, cap) => n.or(cap),
    };
    let body = match plan.to {
        Api::Messages => {
            let max_tokens = asked_for.unwrap_or(asked.default_max_tokens).max(1);
            messages::write_request(&conversation, asked.model, max_tokens)?
        }
        Api::Chat => chat::write_request(&conversation, asked.model, asked_for)?,
        other => return Err(not_yet(plan, other)),
    };
    Ok((Bytes::from(body), Translation::new(plan, &conversation)))
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

#[cfg(test)]
mod tests;
