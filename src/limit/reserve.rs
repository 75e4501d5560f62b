//! Reservations (`budget_mode = "reserve"`): at admission a request holds its worst cost
//! against its key's budget, and its worst token count against the key's `tpm`: the prompt
//! plus the output it allows (its own limit, else the model's `max_output_tokens`). When what
//! is left cannot pay for that output, the output limit sent upstream is lowered to what it
//! can pay, so the provider itself stops there; a request whose prompt alone cannot be paid
//! is refused. The hold is replaced by the real cost and tokens when the request ends, in
//! one step, so the requests in flight of a key never together pass its budget or tpm.
//!
//! The decisions here are pure (`fit_budget`, `fit_tokens`); the holds are kept by `Spend`
//! and `Limiter` on this gateway, or in Redis (`shared::FleetHold`) across a fleet.

use std::sync::Arc;
use std::time::Instant;

use super::budget::{BudgetHold, Spend, pico};
use super::rate::{Limiter, Refusal, TokenHold};
use super::shared::FleetHold;
use crate::config::Price;
use crate::config::keys::Key;

/// Credits: per million prompt and completion tokens, plus the per-request price when the
/// upstream served the request; to the nearest 10^-12 credit, so that binary fractions do not
/// show (4 × 1e-6 + 8 × 2e-6 is 0.00002, not 0.000019999999999999998).
pub fn cost(price: &Price, prompt: u64, completion: u64, served: bool) -> f64 {
    let tokens = price.prompt * prompt as f64 / 1e6 + price.completion * completion as f64 / 1e6;
    let cost = tokens + if served { price.request } else { 0.0 };
    (cost * 1e12).round() / 1e12
}

/// What a request may cost, as known at admission.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    /// Prompt tokens: a count, or a bound on it.
    pub prompt: u64,
    /// Output tokens the request allows.
    pub output: u64,
    /// The output limit can be lowered (the endpoint has one to set).
    pub lowerable: bool,
    pub price: Price,
}

impl Ask {
    /// The least output the request is served with: one token when its limit can be
    /// lowered, else all it allows.
    pub fn least(&self) -> u64 {
        if self.lowerable && self.output > 0 {
            1
        } else {
            self.output
        }
    }

    fn cost(&self, output: u64) -> i128 {
        pico(cost(&self.price, self.prompt, output, true))
    }
}

/// The most output (at most what the request allows, at least `least`) whose cost fits in
/// `left` picocredits; None when not even the least does.
pub fn fit_budget(left: i128, ask: &Ask) -> Option<u64> {
    if ask.cost(ask.output) <= left {
        return Some(ask.output);
    }
    let least = ask.least();
    if ask.cost(least) > left {
        return None;
    }
    // cost(lo) fits, cost(hi) does not.
    let (mut lo, mut hi) = (least, ask.output);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ask.cost(mid) <= left {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

/// The most output whose tokens, with the prompt's, fit in `left`; None when not even the
/// least does.
pub fn fit_tokens(left: u64, ask: &Ask) -> Option<u64> {
    let room = left.checked_sub(ask.prompt)?;
    if room >= ask.output {
        Some(ask.output)
    } else if room >= ask.least() {
        Some(room)
    } else {
        None
    }
}

/// Why a reservation was refused.
#[derive(Debug)]
pub enum Short {
    /// Not even the prompt can be paid from what is left of the budget (402).
    Budget,
    /// It could be, but requests in flight hold what is left until they end (429).
    Held,
    /// Not even the prompt fits in what is left of the tpm window (429).
    Tpm(Refusal),
}

/// What a request holds until it ends.
#[derive(Debug, Default)]
pub struct Reservation {
    /// The output tokens held: the limit the upstream is sent when `lowered`.
    pub output: u64,
    /// The output limit was lowered below what the request allows.
    pub lowered: bool,
    /// It was lowered by the budget (the reply says so: `x-modelgate-budget-limited`).
    pub budget_limited: bool,
    pub budget: Option<BudgetHold>,
    pub tokens: Option<TokenHold>,
    pub fleet: Option<FleetHold>,
}

impl Reservation {
    /// Holds `ask` on this gateway: tpm first, then the budget, each decided under its own
    /// lock (`floor`: the fleet's spend when Redis told it).
    pub fn local(
        spend: &Arc<Spend>,
        limiter: &Limiter,
        key: &Key,
        ask: Ask,
        floor: i128,
        now: Instant,
    ) -> Result<Reservation, Short> {
        let wanted = ask.output;
        let mut output = wanted;
        let mut tokens = limiter
            .hold_tokens(key, now, |left| {
                output = fit_tokens(left, &ask)?;
                Some(ask.prompt.saturating_add(output))
            })
            .map_err(Short::Tpm)?;
        let after_tpm = output;
        let ask = Ask { output, ..ask };
        let budget = spend.hold(key, floor, |left, held| {
            match fit_budget(left - held, &ask) {
                Some(o) => output = o,
                None if fit_budget(left, &ask).is_some() => return Err(Short::Held),
                None => return Err(Short::Budget),
            }
            Ok(ask.cost(output))
        })?;
        if let Some(t) = tokens.as_mut() {
            t.shrink_to(ask.prompt.saturating_add(output));
        }
        Ok(Reservation {
            output,
            lowered: output < wanted,
            budget_limited: output < after_tpm,
            budget,
            tokens,
            fleet: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(prompt: u64, output: u64) -> Ask {
        Ask {
            prompt,
            output,
            lowerable: true,
            price: Price {
                prompt: 1_000_000.0,
                completion: 2_000_000.0,
                request: 0.0,
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_output_is_lowered_to_what_the_budget_pays() {
        // 1 credit a prompt token, 2 an output token.
        let left = pico(100.0);
        assert_eq!(fit_budget(left, &ask(10, 40)), Some(40), "90 of 100");
        assert_eq!(
            fit_budget(left, &ask(10, 1000)),
            Some(45),
            "10 + 2 × 45 = 100"
        );
        assert_eq!(fit_budget(left, &ask(98, 1000)), Some(1));
        assert_eq!(fit_budget(left, &ask(99, 1000)), None, "99 + 2 > 100");
        let fixed = Ask {
            lowerable: false,
            ..ask(10, 1000)
        };
        assert_eq!(fit_budget(left, &fixed), None, "cannot be lowered");
        let free = Ask {
            price: Price::default(),
            ..ask(10, 1000)
        };
        assert_eq!(fit_budget(0, &free), Some(1000));
        assert_eq!(fit_budget(-1, &free), None, "nothing left");
    }

    #[test]
    fn the_output_is_lowered_to_what_the_window_holds() {
        assert_eq!(fit_tokens(100, &ask(10, 50)), Some(50));
        assert_eq!(fit_tokens(100, &ask(10, 500)), Some(90));
        assert_eq!(fit_tokens(100, &ask(100, 500)), None);
        let embed = Ask {
            lowerable: false,
            ..ask(100, 0)
        };
        assert_eq!(fit_tokens(100, &embed), Some(0));
        assert_eq!(fit_tokens(99, &embed), None);
    }
}
