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
use crate::config::{DROPPABLE_PARAMS, PoolConfig, Provider};
use crate::error::GatewayError;
use ir::Conversation;
pub use reply::Translation;

/// A 400 naming the parameter.
pub(crate) fn bad(param: &'static str, message: String) -> GatewayError {
    GatewayError::InvalidParameter { param, message }
}

/// A request field the provider has no equivalent of: noted in the conversation, to be refused
/// or left out by `settle` (never dropped in silence); a field no API has is the client's 400.
pub(crate) fn refuse(c: &mut Conversation, name: &str) -> Result<(), GatewayError> {
    match DROPPABLE_PARAMS.iter().find(|k| **k == name) {
        Some(param) => {
            if !c.refused.contains(param) {
                c.refused.push(param);
            }
            Ok(())
        }
        None => Err(GatewayError::InvalidParameter {
            param: "body",
            message: format!("Unrecognized request argument supplied: {name}"),
        }),
    }
}

/// The fields `to` has no equivalent of, added to those the reader noted: each is left out if
/// `drop` names it, else the first is the client's 400 naming it.
fn settle(c: &mut Conversation, to: Api, drop: &[String]) -> Result<(), GatewayError> {
    // Anthropic's current API has no sampling parameters; OpenAI's has no `top_k`.
    if to == Api::Messages {
        if c.temperature.take().is_some() {
            refuse(c, "temperature")?;
        }
        if c.top_p.take().is_some() {
            refuse(c, "top_p")?;
        }
    }
    if c.top_k.take().is_some() {
        refuse(c, "top_k")?;
    }
    match c
        .refused
        .iter()
        .find(|name| !drop.iter().any(|d| d == *name))
    {
        Some(param) => Err(GatewayError::Unsupported {
            param,
            message: format!(
                "'{param}' has no equivalent in the API of this model's provider, so it \
                 cannot be honoured."
            ),
        }),
        None => Ok(()),
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
    /// The fields left out where the provider has no equivalent (the pool's `drop_params`).
    pub drop: &'a [String],
}

/// The translated request body and the translation of its reply.
pub fn request(plan: Plan, asked: &Asked<'_>) -> Result<(Bytes, Translation), GatewayError> {
    let mut conversation = match plan.from {
        Api::Chat => chat::read_request(asked.body)?,
        Api::Messages => messages::read_request(asked.body)?,
        Api::Responses => responses::read_request(asked.body)?,
        other => return Err(not_yet(plan, other)),
    };
    settle(&mut conversation, plan.to, asked.drop)?;
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
