//! Web stage, the OpenAI-compatible balance endpoints chat front-ends call with a bearer key
//! (`/v1/dashboard/billing/subscription` and `/usage`). Credits are reported as dollars, and
//! usage in cents as OpenAI did; a key without a budget reports the conventional 100000000
//! "unlimited" hard limit.

use jiff::tz::TimeZone;
use pingora_proxy::Session;
use serde_json::json;

use super::summary::{Bucket, Range, compute};
use super::{Exchange, fail, params, store_failed};
use crate::config::keys::Key;
use crate::error::GatewayError;
use crate::limit::budget;
use crate::web::Web;

const UNLIMITED: f64 = 100_000_000.0;
const DAY_MS: i64 = 24 * 3600 * 1000;
/// The widest `start_date..end_date` accepted, as OpenAI's endpoint did.
const MAX_DAYS: i64 = 100;

pub async fn subscription(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    key: &Key,
) -> pingora_error::Result<()> {
    if let Err(e) = params::parse(session.req_header().uri.query(), &[]) {
        return fail(session, ex, &e).await;
    }
    let limit = key.budget.unwrap_or(UNLIMITED);
    let spend = web.spend.get(&key.id);
    let body = json!({
        "object": "billing_subscription",
        "has_payment_method": true,
        "soft_limit_usd": limit,
        "hard_limit_usd": limit,
        "system_hard_limit_usd": limit,
        "access_until": key.expires_at.unwrap_or(0),
        "plan": {"title": "modelgate", "id": "modelgate"},
        "modelgate": {
            "key_id": key.id,
            "spend": budget::exact(spend),
            "remaining": key.budget.map(|b| budget::remaining(spend, b)),
        },
    });
    super::json(session, ex, &body).await
}

/// `start_date`/`end_date` (`YYYY-MM-DD`, UTC days, end exclusive; default this month so far).
pub async fn usage(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    key: &Key,
) -> pingora_error::Result<()> {
    let range = match parse(session.req_header().uri.query(), super::now_ms()) {
        Ok(r) => r,
        Err(e) => return fail(session, ex, &e).await,
    };
    // Read and summed off the proxy threads, as the summary is.
    let (store, q) = (
        web.store.clone(),
        super::summary::rollup_query(Some(&key.id), &range),
    );
    let body = match super::blocking(move || Ok(daily_costs(&store.rollup(&q)?, &range))).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => return fail(session, ex, &e).await,
        Err(e) => return fail(session, ex, &store_failed(&ex.request_id, &e)).await,
    };
    super::json(session, ex, &body).await
}

/// The answer of `usage`: each day's cost by model (in cents), and the total.
fn daily_costs(
    rollup: &crate::store::rollup::Rollup,
    range: &Range,
) -> Result<serde_json::Value, GatewayError> {
    // The day totals come from the summary; the per-model line items from the same rows.
    let summary = compute(rollup, range)?;
    let starts: Vec<i64> = summary["buckets"]
        .as_array()
        .map(|b| b.iter().filter_map(|d| d["start_ms"].as_i64()).collect())
        .unwrap_or_default();
    let mut days: Vec<IndexedCosts<'_>> = vec![IndexedCosts::default(); starts.len()];
    for row in &rollup.rows {
        let i = starts
            .partition_point(|s| *s <= row.bucket_ms)
            .saturating_sub(1);
        if let Some(items) = days.get_mut(i) {
            items.add(&row.model, row.sums.cost);
        }
    }
    let cents = |c: f64| (c * 100.0 * 1e6).round() / 1e6;
    let daily: Vec<serde_json::Value> = starts
        .iter()
        .zip(days)
        .map(|(start, items)| {
            let items: Vec<serde_json::Value> = items
                .items
                .into_iter()
                .map(|(name, cost)| json!({"name": name, "cost": cents(cost)}))
                .collect();
            json!({"timestamp": start / 1000, "line_items": items})
        })
        .collect();
    let total = summary["totals"]["cost"].as_f64().unwrap_or(0.0);
    Ok(json!({
        "object": "list",
        "daily_costs": daily,
        "total_usage": cents(total),
    }))
}

/// A day's cost by model, in the order models first appear.
#[derive(Clone, Default)]
struct IndexedCosts<'a> {
    items: Vec<(&'a str, f64)>,
    at: std::collections::HashMap<&'a str, usize>,
}

impl<'a> IndexedCosts<'a> {
    fn add(&mut self, model: &'a str, cost: f64) {
        match self.at.get(model) {
            Some(&i) => self.items[i].1 += cost,
            None => {
                self.at.insert(model, self.items.len());
                self.items.push((model, cost));
            }
        }
    }
}

fn parse(query: Option<&str>, now_ms: i64) -> Result<Range, GatewayError> {
    let pairs = params::parse(query, &["start_date", "end_date"])?;
    let utc = TimeZone::UTC;
    let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
    let first_of_month = jiff::Timestamp::from_millisecond(now_ms)
        .ok()
        .and_then(|t| t.to_zoned(utc.clone()).first_of_month().ok())
        .and_then(|z| z.start_of_day().ok())
        .map_or(today, |z| z.timestamp().as_millisecond());
    let (mut start, mut end) = (first_of_month, today + DAY_MS);
    for (k, v) in pairs {
        let ms = params::time(k, &v, &utc)?;
        match k {
            "start_date" => start = ms,
            _ => end = ms,
        }
    }
    if start > end || end - start > MAX_DAYS * DAY_MS {
        return Err(GatewayError::InvalidParameter {
            param: "start_date",
            message: format!("the range must run forwards and span at most {MAX_DAYS} days"),
        });
    }
    Ok(Range {
        start_ms: start,
        end_ms: end,
        tz: utc,
        tz_name: "UTC".into(),
        bucket: Bucket::Day,
        model: None,
        key_id: None,
    })
}
