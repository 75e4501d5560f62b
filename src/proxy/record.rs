//! The end of a request: its usage record. Tokens are the upstream's own figures when it
//! reported them; otherwise, for a metered reply that carried content, the tokenizer's
//! (marked `estimated`). Cost follows the model's price.

use super::ctx::Ctx;
use crate::config::Price;
use crate::meter::{Usage, estimate};
use crate::store::{RecordRef, UsageRecord};

/// The request's tokens: the upstream's own figures, or a count to make.
pub enum Tokens {
    Reported(Usage),
    /// Estimate when the upstream took the request and did not account for it: a success
    /// without usage, or a reply cut or abandoned after its success header (the prompt was
    /// read; what content passed counts too).
    Estimate(estimate::Job),
    /// A stream cut by its budget after `output` output events, each at least a token: the
    /// prompt is counted, the output is those tokens (estimated).
    Cut {
        job: estimate::Job,
        output: u64,
    },
    None,
}

impl Tokens {
    /// The tokens of the request in `ctx`, which ended with `status`.
    pub fn of(ctx: &Ctx, status: u16) -> Tokens {
        if let Some(output) = ctx.meter.cut_by_budget() {
            let mut job = estimate_job(ctx);
            job.output = estimate::Output::Nothing;
            return Tokens::Cut { job, output };
        }
        match ctx.meter.usage() {
            Some(u) => Tokens::Reported(complete(u)),
            None if ctx.meter.estimates()
                && (succeeded(status)
                    || ctx.accepted
                    || ctx.abandoned
                    || ctx.ttft_ms.is_some()) =>
            {
                Tokens::Estimate(estimate_job(ctx))
            }
            None => Tokens::None,
        }
    }

    /// The usage, and whether it is estimated; an estimate is counted off the proxy's thread,
    /// or roughly once the shutdown cuts.
    pub async fn resolve(self, life: Option<&crate::ops::lifecycle::Lifecycle>) -> (Usage, bool) {
        match self {
            Tokens::Reported(u) => (u, false),
            Tokens::Estimate(job) => {
                let cut = crate::ops::lifecycle::cut(life);
                (job.count_off_thread(cut).await, true)
            }
            Tokens::Cut { job, output } => {
                let cut = crate::ops::lifecycle::cut(life);
                let prompt = job.count_off_thread(cut).await.prompt_tokens;
                let usage = Usage {
                    prompt_tokens: prompt,
                    completion_tokens: output,
                    total_tokens: prompt.saturating_add(output),
                    ..Usage::default()
                };
                (usage, true)
            }
            Tokens::None => (Usage::default(), false),
        }
    }
}

/// A final status that is a success.
pub fn succeeded(status: u16) -> bool {
    (200..300).contains(&status)
}

/// The record of a request that passed auth, which ended with `status`.
pub fn build(
    ctx: &Ctx,
    status: u16,
    key_id: &str,
    ended: std::time::Instant,
    tokens: (Usage, bool),
) -> UsageRecord {
    view(ctx, status, key_id, ended, tokens).to_record()
}

/// `build`'s record, borrowed from `ctx`.
fn view<'a>(
    ctx: &'a Ctx,
    status: u16,
    key_id: &'a str,
    ended: std::time::Instant,
    (usage, estimated): (Usage, bool),
) -> RecordRef<'a> {
    let ok = succeeded(status);
    let route = ctx.route.as_ref();
    let price = route.map(|r| r.model.price).unwrap_or_default();
    let cost = cost(&price, &usage, ok && ctx.proxied && !ctx.free);
    let upstream = route
        .and_then(|r| r.pool.upstreams.get(ctx.upstream))
        .filter(|_| ctx.proxied)
        .map_or("", |u| u.cfg.url.as_str());
    RecordRef {
        time_ms: ctx.time_ms,
        request_id: &ctx.request_id,
        key_id,
        listener: ctx.listener.name(),
        endpoint: ctx.group,
        model: &ctx.model,
        status,
        stream: ctx.stream,
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        total_tokens: usage.total_tokens,
        cached_prompt_tokens: usage.cached_tokens,
        cache_write_tokens: usage.cache_write_tokens,
        reasoning_tokens: usage.reasoning_tokens,
        cost,
        latency_ms: ended.saturating_duration_since(ctx.started).as_millis() as u64,
        ttft_ms: ctx.ttft_ms,
        upstream,
        estimated,
        attempts: ctx.attempts,
        served_model: route
            .filter(|_| ctx.proxied)
            .map_or("", |r| r.id_for(&ctx.model)),
        cut: if ctx.meter.cut_by_budget().is_some() {
            "budget"
        } else {
            ctx.cut
        },
    }
}

/// Before a reply's last byte goes to the client, its record as it will be when that write
/// succeeds goes to the journal: a crash right after the write leaves that record, not one cut
/// by the crash. For a reply whose usage the upstream did not report, a rough count (about
/// four bytes a token of the request and of the output), marked estimated: the tokenizer's
/// count comes later, off this thread, and replaces it. The request's end writes its record
/// again only if it differs.
pub async fn preclose(ctx: &mut Ctx) {
    let (Some(_), Some(status)) = (ctx.journal.as_ref(), ctx.sent.status) else {
        return;
    };
    if ctx.meter.cut_by_budget().is_some() {
        return;
    }
    let tokens = match ctx.meter.usage() {
        Some(usage) => (complete(usage), false),
        None if ctx.meter.estimates() => (estimate_job(ctx).rough(), true),
        None => return,
    };
    // The line is encoded from what `ctx` holds (no record built for it), then waited for.
    let (line, preclosed) = {
        let key_id = ctx.key.as_ref().map_or("", |k| k.id.as_str());
        let r = view(ctx, status, key_id, std::time::Instant::now(), tokens);
        let Some(entry) = ctx.journal.as_ref() else {
            return;
        };
        let line = entry.close_line(&r);
        (
            line,
            (!r.estimated).then_some((r.status, r.prompt_tokens, r.completion_tokens)),
        )
    };
    if let Some(entry) = ctx.journal.as_mut() {
        entry.written(line).await;
    }
    if preclosed.is_some() {
        ctx.preclosed = preclosed;
    }
}

/// Whether the request's record is the one `preclose` wrote.
pub fn as_preclosed(ctx: &Ctx, r: &UsageRecord) -> bool {
    ctx.preclosed == Some((r.status, r.prompt_tokens, r.completion_tokens))
        && r.cut.is_empty()
        && !r.estimated
}

/// Some upstreams leave `total_tokens` out; it is the sum.
fn complete(mut u: Usage) -> Usage {
    if u.total_tokens == 0 {
        u.total_tokens = u.prompt_tokens.saturating_add(u.completion_tokens);
    }
    u
}

fn estimate_job(ctx: &Ctx) -> estimate::Job {
    let model = ctx
        .route
        .as_ref()
        .map_or(ctx.model.as_str(), |r| r.model.upstream_model.as_str());
    // A Messages stream cut before its final counts still had its prompt counted.
    let reported_prompt = match &ctx.meter {
        crate::meter::Meter::Sse(m) => m.prompt_reported(),
        _ => None,
    };
    estimate::Job {
        model: model.to_string(),
        reported_prompt,
        body: ctx.body.clone(),
        output: ctx.meter.output(),
    }
}

/// Credits for the usage: each token once, at its kind's price (cached and cache-write
/// prompt tokens at theirs, reasoning at its own; a kind without a price at `prompt` or
/// `completion`), per million, plus the per-request price when served; to the nearest
/// 10^-12 credit, as `limit::reserve::cost`.
pub fn cost(price: &Price, usage: &Usage, served: bool) -> f64 {
    let per_m = |p: f64, n: u64| p * n as f64 / 1e6;
    let cached = usage.cached_tokens.min(usage.prompt_tokens);
    let written = usage.cache_write_tokens.min(usage.prompt_tokens - cached);
    let reasoning = usage.reasoning_tokens.min(usage.completion_tokens);
    let tokens = per_m(price.prompt, usage.prompt_tokens - cached - written)
        + per_m(price.cached_prompt.unwrap_or(price.prompt), cached)
        + per_m(price.cache_write.unwrap_or(price.prompt), written)
        + per_m(price.completion, usage.completion_tokens - reasoning)
        + per_m(price.reasoning.unwrap_or(price.completion), reasoning);
    let cost = tokens + if served { price.request } else { 0.0 };
    (cost * 1e12).round() / 1e12
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each token priced once: cached and cache-write prompt tokens at their own prices
    /// instead of `prompt`, reasoning at its own instead of `completion`; a kind without a
    /// price falls back.
    #[test]
    fn cached_cache_write_and_reasoning_tokens_are_priced_once_at_their_own_price() {
        let u = Usage {
            prompt_tokens: 1_000_000,
            cached_tokens: 600_000,
            cache_write_tokens: 100_000,
            completion_tokens: 500_000,
            reasoning_tokens: 200_000,
            total_tokens: 1_500_000,
        };
        let p = Price {
            prompt: 3.0,
            completion: 15.0,
            cached_prompt: Some(0.3),
            cache_write: Some(3.75),
            reasoning: Some(10.0),
            ..Default::default()
        };
        // 0.3 × 3 + 0.6 × 0.3 + 0.1 × 3.75 + 0.3 × 15 + 0.2 × 10
        assert_eq!(cost(&p, &u, false), 0.9 + 0.18 + 0.375 + 4.5 + 2.0);
        let plain = Price {
            prompt: 3.0,
            completion: 15.0,
            ..Default::default()
        };
        assert_eq!(cost(&plain, &u, false), 3.0 + 7.5);
        // The reservation holds the dearest a token may be.
        let worst = p.worst();
        assert_eq!((worst.prompt, worst.completion), (3.75, 15.0));
    }

    #[test]
    fn cost_is_per_million_tokens_plus_per_request() {
        let p = Price {
            prompt: 1.0,
            completion: 2.0,
            request: 0.5,
            ..Default::default()
        };
        let u = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 500_000,
            total_tokens: 1_500_000,
            ..Default::default()
        };
        assert!((cost(&p, &u, true) - 2.5).abs() < 1e-9);
        assert!((cost(&p, &u, false) - 2.0).abs() < 1e-9);
        // No binary fraction shows: 4 × 1e-6 + 8 × 2e-6 is written 0.00002.
        let small = Usage {
            prompt_tokens: 4,
            completion_tokens: 8,
            total_tokens: 12,
            ..Default::default()
        };
        assert_eq!(cost(&p, &small, false).to_string(), "0.00002");
        let tenth = Price {
            prompt: 0.1,
            completion: 0.0,
            request: 0.0,
            ..Default::default()
        };
        let one = Usage {
            prompt_tokens: 1,
            completion_tokens: 0,
            total_tokens: 1,
            ..Default::default()
        };
        assert_eq!(cost(&tenth, &one, false).to_string(), "0.0000001");
        assert_eq!(
            complete(Usage {
                prompt_tokens: 2,
                completion_tokens: 3,
                total_tokens: 0,
                ..Default::default()
            })
            .total_tokens,
            5
        );
    }
}
