//! The admission step that holds a request's worst cost and tokens until it ends
//! (`budget_mode = "reserve"`, see `limit::reserve`): on this gateway, or in Redis across a
//! fleet. The prompt is first bounded by the body's length (no tokenizer on the hot path);
//! only when that bound does not fit is it counted, off the proxy thread.

use bytes::Bytes;

use super::Gateway;
use super::ctx::Ctx;
use crate::config::keys::Key;
use crate::config::{BudgetMode, Price};
use crate::error::GatewayError;
use crate::limit::budget::pico;
use crate::limit::reserve::{Ask, Reservation, Short};
use crate::limit::shared::OnDown;
use crate::ops::lifecycle::InFlight;
use crate::route::body::Probe;
use crate::route::endpoint::{Endpoint, Metering};
use crate::route::{Route, Router};

/// The field that limits an endpoint's output, which a lowered limit is written to.
pub(super) fn output_field(path: &str) -> Option<&'static str> {
    match path {
        // `max_tokens` is refused by OpenAI's reasoning models; every current server takes
        // `max_completion_tokens`.
        "/v1/chat/completions" => Some("max_completion_tokens"),
        "/v1/completions" | "/v1/messages" => Some("max_tokens"),
        "/v1/responses" => Some("max_output_tokens"),
        _ => None,
    }
}

/// What a request reserves for, and the upstream request's lowered output limit.
pub(super) struct Asking<'a> {
    pub key: &'a Key,
    pub endpoint: Endpoint,
    pub path: &'a str,
    pub route: &'a Route,
    pub router: &'a Router,
    pub probe: &'a Probe,
    pub body: &'a Bytes,
    /// The key's spend across the fleet, when Redis told it at admission.
    pub fleet_spend: Option<f64>,
}

/// The dearest of each price among the routes a request may take.
fn dearest(a: Price, b: Price) -> Price {
    let (a, b) = (a.worst(), b.worst());
    Price {
        prompt: a.prompt.max(b.prompt),
        completion: a.completion.max(b.completion),
        request: a.request.max(b.request),
        ..Price::default()
    }
}

impl Gateway {
    /// Holds the request's worst cost and tokens (kept in `ctx.reservation`). Returns the
    /// output limit to send upstream, with the field to write it to: the output held, when it
    /// was lowered or the request named no limit.
    pub(super) async fn reserve(
        &self,
        ctx: &mut Ctx,
        a: Asking<'_>,
    ) -> Result<Option<(u64, &'static str)>, GatewayError> {
        let key = a.key;
        let config = &self.shared.live.fixed;
        if config.limits.budget_mode != BudgetMode::Reserve
            || (key.budget.is_none() && key.tpm.is_none())
            || a.endpoint.metering == Metering::Free
            || !crate::meter::enabled()
        {
            return Ok(None);
        }
        let field = output_field(a.path).filter(|_| a.probe.multipart_boundary.is_none());
        let by_tokens = matches!(
            a.endpoint.metering,
            Metering::Chat | Metering::Responses | Metering::Messages | Metering::Usage
        );
        // A fallback may serve it: the dearest price of every route it may take.
        let price = a
            .route
            .model
            .fallbacks
            .iter()
            .filter(|m| key.may_use_model(m))
            .filter_map(|m| a.router.get(m))
            .fold(a.route.model.price.worst(), |p, r| {
                dearest(p, r.model.price)
            });
        let output = match field {
            Some(_) => a
                .probe
                .output_limit()
                .unwrap_or(a.route.model.max_output_tokens),
            None => 0,
        };
        let mut ask = Ask {
            // A token is at least a byte of the prompt's text, which the body holds.
            prompt: if by_tokens { a.body.len() as u64 } else { 0 },
            output,
            lowerable: field.is_some(),
            price,
        };
        let mut held = self.hold(ctx, key, ask, a.fleet_spend).await;
        if held.is_err() && ask.prompt > 0 {
            // The bound did not fit: count the prompt (as the estimate does) and try again.
            let job = crate::meter::estimate::Job {
                model: a.route.model.upstream_model.clone(),
                reported_prompt: None,
                body: a.body.clone(),
                output: crate::meter::estimate::Output::Nothing,
            };
            let life = ctx.life.as_ref().map(InFlight::get);
            let counted = job
                .count_off_thread(crate::ops::lifecycle::cut(life))
                .await
                .prompt_tokens;
            // The provider adds a few tokens a message around the text.
            ask.prompt = counted + counted / 50 + 16;
            if ask.prompt < a.body.len() as u64 {
                held = self.hold(ctx, key, ask, a.fleet_spend).await;
            }
        }
        let reservation = held?;
        // The upstream is told the output held, so that it stops there: when the budget or
        // the window lowered it, and when the request named none (the provider's default may
        // be more than the hold; the legacy completions' default, 16 tokens, is less).
        let named = a.probe.output_limit().is_some();
        let send = reservation.lowered || (!named && a.path != "/v1/completions");
        let limit = send.then_some(reservation.output);
        ctx.reservation = Some(Box::new(reservation));
        Ok(limit.zip(field))
    }

    /// One try at holding `ask`: across the fleet when Redis is there, else on this gateway.
    async fn hold(
        &self,
        ctx: &Ctx,
        key: &Key,
        ask: Ask,
        fleet_spend: Option<f64>,
    ) -> Result<Reservation, GatewayError> {
        let shared = &self.shared;
        let refused = |short| match short {
            Short::Budget => GatewayError::InsufficientBalance,
            // What is left is held by the key's requests in flight: one ends soon.
            Short::Held => GatewayError::RateLimited {
                message: "What is left of this key's budget is held by its requests in \
                          flight; retry when one has ended."
                    .into(),
                retry_after: 1,
                reason: "budget_held",
            },
            Short::Tpm(r) => r.into_error(),
        };
        if let Some(fleet) = shared.shared_limits.as_ref() {
            if fleet.usable() {
                match fleet.reserve(key, &ctx.request_id, ask).await {
                    Ok(r) => return Ok(r),
                    Err(Some(short)) => return Err(refused(short)),
                    Err(None) => {}
                }
            }
            if fleet.on_down == OnDown::Deny {
                return Err(GatewayError::LimiterUnavailable);
            }
        }
        let floor = fleet_spend.map_or(0, pico);
        let now = std::time::Instant::now();
        Reservation::local(&shared.spend, &shared.limiter, key, ask, floor, now).map_err(refused)
    }
}
