//! Web stage, `GET /api/usage/summary`: a key's totals, time buckets and per-model breakdown
//! for a range, plus what it may spend. Built from the store's 15-minute rollups (never a scan
//! of raw rows); buckets are local hours or days in the asked time zone, so a day in
//! Asia/Kolkata (+05:30) is exactly the records of that local day.

use std::collections::HashMap;

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, Zoned};
use pingora_proxy::Session;
use serde_json::{Value, json};

use super::{Exchange, blocking, fail, params, store_failed};
use crate::config::keys::Key;
use crate::error::GatewayError;
use crate::limit::budget;
use crate::store::rollup::{self, Rollup, RollupQuery, Sums};
use crate::web::Web;

const DAY_MS: i64 = 24 * 3600 * 1000;
/// More buckets than a chart can show; a finer bucket over a long range is refused.
pub const MAX_BUCKETS: usize = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    Quarter,
    Hour,
    Day,
    /// From Monday 00:00 local.
    Week,
    Month,
}

impl Bucket {
    pub fn name(self) -> &'static str {
        match self {
            Bucket::Quarter => "15m",
            Bucket::Hour => "hour",
            Bucket::Day => "day",
            Bucket::Week => "week",
            Bucket::Month => "month",
        }
    }

    /// `auto` picks by the range's length: up to 6 h in quarters, up to 3 days in hours, up
    /// to `MAX_BUCKETS` days in days, beyond in months.
    fn parse(v: &str, span_ms: i64) -> Result<Bucket, GatewayError> {
        match v {
            "15m" => Ok(Bucket::Quarter),
            "hour" => Ok(Bucket::Hour),
            "day" => Ok(Bucket::Day),
            "week" => Ok(Bucket::Week),
            "month" => Ok(Bucket::Month),
            "auto" | "" if span_ms <= 6 * 3600 * 1000 => Ok(Bucket::Quarter),
            "auto" | "" if span_ms <= 3 * DAY_MS => Ok(Bucket::Hour),
            "auto" | "" if span_ms < (MAX_BUCKETS as i64 - 1) * DAY_MS => Ok(Bucket::Day),
            "auto" | "" => Ok(Bucket::Month),
            _ => Err(GatewayError::InvalidParameter {
                param: "bucket",
                message: format!(
                    "bucket is auto, 15m, hour, day, week or month, not '{}'",
                    params::shown(v)
                ),
            }),
        }
    }
}

/// The range of a summary, parsed from `start`, `end`, `tz`, `bucket` (and `model`).
#[derive(Debug, Clone)]
pub struct Range {
    pub start_ms: i64,
    pub end_ms: i64,
    pub tz: TimeZone,
    pub tz_name: String,
    pub bucket: Bucket,
    pub model: Option<String>,
    /// The console's `key_id=` (a key's own summary is always its own).
    pub key_id: Option<String>,
}

/// `console`: the range may name a `key_id`.
pub fn parse_range(query: Option<&str>, now_ms: i64, console: bool) -> Result<Range, GatewayError> {
    const NAMES: [&str; 6] = ["start", "end", "tz", "bucket", "model", "key_id"];
    let pairs = params::parse(query, &NAMES[..NAMES.len() - usize::from(!console)])?;
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    };
    // An offset's `+` sent unencoded arrives as a space: read as `+` (as `start`/`end` are).
    let raw = get("tz").unwrap_or("UTC").trim_end();
    let tz_name = match raw.strip_prefix(' ') {
        Some(rest) => format!("+{}", rest.trim_start()),
        None => raw.trim().to_string(),
    };
    let tz = params::zone(&tz_name)?;
    let tz_name = tz.iana_name().map_or(tz_name, str::to_string);
    let end_ms = match get("end") {
        Some(v) => params::time("end", v, &tz)?,
        None => now_ms.saturating_add(1),
    };
    let start_ms = match get("start") {
        Some(v) => params::time("start", v, &tz)?,
        None => end_ms.saturating_sub(DAY_MS),
    };
    if start_ms > end_ms {
        return Err(GatewayError::InvalidParameter {
            param: "start",
            message: "start is after end".into(),
        });
    }
    let bucket = Bucket::parse(get("bucket").unwrap_or("auto"), end_ms - start_ms)?;
    Ok(Range {
        start_ms,
        end_ms,
        tz,
        tz_name,
        bucket,
        model: get("model").map(str::to_string),
        key_id: get("key_id").map(str::to_string),
    })
}

fn zoned(ms: i64, tz: &TimeZone) -> Result<Zoned, GatewayError> {
    Timestamp::from_millisecond(ms)
        .map(|t| t.to_zoned(tz.clone()))
        .map_err(|_| GatewayError::InvalidParameter {
            param: "start",
            message: "the range is outside the supported years".into(),
        })
}

/// The starts (unix ms) of the local buckets that cover `[start, end)`: the first one at or
/// before `start`. Days follow the zone's calendar (23 or 25 hours across a DST change).
pub fn bucket_starts(r: &Range) -> Result<Vec<i64>, GatewayError> {
    let too_many = || GatewayError::InvalidParameter {
        param: "bucket",
        message: format!(
            "the range holds more than {MAX_BUCKETS} {} buckets; choose a larger bucket",
            r.bucket.name()
        ),
    };
    let mut starts = Vec::new();
    let z = zoned(r.start_ms, &r.tz)?;
    let mut at = match r.bucket {
        Bucket::Quarter => zoned(rollup::bucket_of(r.start_ms), &r.tz)?,
        Bucket::Hour => z
            .with()
            .minute(0)
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .map_err(|_| too_many())?,
        Bucket::Day => z.start_of_day().map_err(|_| too_many())?,
        Bucket::Week => {
            let back = i64::from(z.weekday().to_monday_zero_offset());
            z.start_of_day()
                .and_then(|d| d.checked_sub(back.days()))
                .and_then(|d| d.start_of_day())
                .map_err(|_| too_many())?
        }
        Bucket::Month => z
            .first_of_month()
            .and_then(|d| d.start_of_day())
            .map_err(|_| too_many())?,
    };
    loop {
        let ms = at.timestamp().as_millisecond();
        if ms >= r.end_ms && !starts.is_empty() {
            return Ok(starts);
        }
        if starts.len() == MAX_BUCKETS {
            return Err(too_many());
        }
        starts.push(ms);
        at = match r.bucket {
            Bucket::Quarter => at.checked_add(15.minutes()),
            Bucket::Hour => at.checked_add(1.hour()),
            Bucket::Day => at.tomorrow().and_then(|d| d.start_of_day()),
            Bucket::Week => at.checked_add(1.week()).and_then(|d| d.start_of_day()),
            Bucket::Month => at.checked_add(1.month()).and_then(|d| d.start_of_day()),
        }
        .map_err(|_| too_many())?;
    }
}

fn ok(status: u16) -> bool {
    (200..300).contains(&status)
}

/// Cost sums of many f64 additions, shown without float noise.
pub(super) fn credits(c: f64) -> f64 {
    (c * 1e9).round() / 1e9
}

fn sums_json(s: &Sums, succeeded: u64) -> Value {
    json!({
        "requests": s.requests,
        "succeeded": succeeded,
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.total_tokens,
        "cost": credits(s.cost),
    })
}

/// The totals of a summary: sums, success rate, latency.
fn totals_json(rollup: &Rollup, total: &Sums, succeeded: u64) -> Value {
    let mut all_bins = rollup::Hist::new();
    for h in rollup.latency.values() {
        for (bin, n) in h {
            *all_bins.entry(*bin).or_default() += n;
        }
    }
    let mut totals = sums_json(total, succeeded);
    totals["failed"] = json!(total.requests - succeeded);
    totals["success_rate"] =
        json!((total.requests > 0).then(|| succeeded as f64 / total.requests as f64));
    totals["latency_avg_ms"] =
        json!((total.requests > 0).then(|| total.latency_ms / total.requests));
    totals["latency_p50_ms"] = json!(rollup::percentile(&all_bins, 0.50));
    totals["latency_p95_ms"] = json!(rollup::percentile(&all_bins, 0.95));
    totals["estimated"] = json!(total.estimated);
    totals
}

/// Totals, buckets, per-model and per-status breakdowns of a rollup, as the API's JSON.
pub fn compute(rollup: &Rollup, r: &Range) -> Result<Value, GatewayError> {
    let starts = bucket_starts(r)?;
    let mut buckets = vec![(Sums::default(), 0u64); starts.len()];
    let mut total = Sums::default();
    let mut succeeded = 0;
    let mut models: HashMap<&str, (Sums, u64)> = HashMap::new();
    let mut keys: HashMap<&str, (Sums, u64)> = HashMap::new();
    let mut statuses: HashMap<u16, u64> = HashMap::new();
    for row in &rollup.rows {
        let good = if ok(row.status) { row.sums.requests } else { 0 };
        let i = starts
            .partition_point(|s| *s <= row.bucket_ms.max(r.start_ms))
            .saturating_sub(1);
        if let Some(b) = buckets.get_mut(i) {
            b.0.add(&row.sums);
            b.1 += good;
        }
        total.add(&row.sums);
        succeeded += good;
        for (map, name) in [
            (&mut models, row.model.as_str()),
            (&mut keys, row.key_id.as_str()),
        ] {
            let m = map.entry(name).or_default();
            m.0.add(&row.sums);
            m.1 += good;
        }
        *statuses.entry(row.status).or_default() += row.sums.requests;
    }
    let totals = totals_json(rollup, &total, succeeded);
    let buckets: Vec<Value> = starts
        .iter()
        .zip(&buckets)
        .map(|(start, (s, good))| {
            let mut v = sums_json(s, *good);
            v["start_ms"] = json!(start);
            v["start"] = json!(local_time(*start, &r.tz));
            v
        })
        .collect();
    let (by_model, folded) = bounded(models);
    let keys: Vec<Value> = bounded(keys)
        .0
        .iter()
        .map(|(key, (s, good))| {
            let mut v = sums_json(s, *good);
            v["key_id"] = json!(key);
            v
        })
        .collect();
    let models: Vec<Value> = by_model
        .iter()
        .map(|(model, (s, good))| {
            let mut v = sums_json(s, *good);
            v["model"] = json!(model);
            let p50 = if *model == OTHER {
                let mut bins = rollup::Hist::new();
                for h in folded.iter().filter_map(|m| rollup.latency.get(*m)) {
                    for (bin, n) in h {
                        *bins.entry(*bin).or_default() += n;
                    }
                }
                rollup::percentile(&bins, 0.5)
            } else {
                rollup
                    .latency
                    .get(*model)
                    .and_then(|b| rollup::percentile(b, 0.5))
            };
            v["latency_p50_ms"] = json!(p50);
            v
        })
        .collect();
    let mut statuses: Vec<(u16, u64)> = statuses.into_iter().collect();
    statuses.sort_unstable();
    let statuses: Vec<Value> = statuses
        .into_iter()
        .map(|(status, requests)| json!({"status": status, "requests": requests}))
        .collect();
    Ok(json!({
        "object": "usage.summary",
        "range": {
            "start": local_time(r.start_ms, &r.tz),
            "end": local_time(r.end_ms, &r.tz),
            "start_ms": r.start_ms,
            "end_ms": r.end_ms,
            "tz": r.tz_name,
            "bucket": r.bucket.name(),
        },
        "totals": totals,
        "buckets": buckets,
        "models": models,
        "keys": keys,
        "statuses": statuses,
    }))
}

/// A breakdown's rows, most costly first (then most requests, then by name).
/// The most models (or keys) a summary lists one by one: the rest are summed as one entry,
/// `(other)`, so a summary stays small however many names its range holds.
pub const TOP: usize = 100;
pub const OTHER: &str = "(other)";

/// The rows by cost, at most `TOP` of them: past that, the last is `(other)`, the sum of the
/// rest; and the names summed into it.
#[allow(clippy::type_complexity)]
fn bounded(rows: HashMap<&str, (Sums, u64)>) -> (Vec<(&str, (Sums, u64))>, Vec<&str>) {
    let mut rows = by_cost(rows);
    if rows.len() <= TOP {
        return (rows, Vec::new());
    }
    let rest = rows.split_off(TOP - 1);
    let mut other = (Sums::default(), 0);
    for (_, (s, good)) in &rest {
        other.0.add(s);
        other.1 += good;
    }
    rows.push((OTHER, other));
    (rows, rest.into_iter().map(|(name, _)| name).collect())
}

fn by_cost(rows: HashMap<&str, (Sums, u64)>) -> Vec<(&str, (Sums, u64))> {
    let mut rows: Vec<(&str, (Sums, u64))> = rows.into_iter().collect();
    rows.sort_by(|a, b| {
        b.1.0
            .cost
            .total_cmp(&a.1.0.cost)
            .then(b.1.0.requests.cmp(&a.1.0.requests))
            .then(a.0.cmp(b.0))
    });
    rows
}

/// RFC 3339 with the zone's offset at that instant, e.g. `2026-11-22T00:00:00+05:30`.
pub fn local_time(ms: i64, tz: &TimeZone) -> String {
    match Timestamp::from_millisecond(ms) {
        Ok(t) => {
            let z = t.to_zoned(tz.clone());
            z.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
        }
        Err(_) => String::new(),
    }
}

/// What the key may spend and use: budget, spend, remaining, limits, expiry.
pub fn key_json(key: &Key, spend: f64) -> Value {
    json!({
        "id": key.id,
        "budget": key.budget,
        "spend": budget::exact(spend),
        "remaining": key.budget.map(|b| budget::remaining(spend, b)),
        "rpm": key.rpm,
        "tpm": key.tpm,
        "max_concurrent": key.max_concurrent,
        "expires_at": key.expires_at.map(|s| local_time(s.saturating_mul(1000), &TimeZone::UTC)),
        "disabled": key.disabled,
        "models": key.model_patterns,
    })
}

/// The rollup query of a range (for one key, or every key).
pub(super) fn rollup_query(key_id: Option<&str>, r: &Range) -> RollupQuery {
    RollupQuery {
        key_id: key_id.map(str::to_string),
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        model: r.model.clone(),
    }
}

/// The range's summary: its rollup read and the summary computed, both off the proxy's
/// threads (a wide range over many keys is real work). `Err`: the store's failure; `Ok(Err)`:
/// the range's.
pub(super) async fn summarize(
    web: &Web,
    key_id: Option<&str>,
    r: &Range,
) -> Result<Result<Value, GatewayError>, crate::store::StoreError> {
    let (store, q, range) = (web.store.clone(), rollup_query(key_id, r), r.clone());
    blocking(move || Ok(compute(&store.rollup(&q)?, &range))).await
}

pub async fn answer(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    key: &Key,
) -> pingora_error::Result<()> {
    let range = match parse_range(session.req_header().uri.query(), super::now_ms(), false) {
        Ok(r) => r,
        Err(e) => return fail(session, ex, &e).await,
    };
    // Refuse a bucket count the chart cannot take before reading anything.
    if let Err(e) = bucket_starts(&range) {
        return fail(session, ex, &e).await;
    }
    let mut body = match summarize(web, Some(&key.id), &range).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return fail(session, ex, &e).await,
        Err(e) => return fail(session, ex, &store_failed(&ex.request_id, &e)).await,
    };
    body["key"] = key_json(key, web.spend.get(&key.id));
    super::json(session, ex, &body).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::record::UsageRecord;
    use crate::store::{Store, StoreOptions};

    const MIDNIGHT_IST: i64 = 1_795_305_600_000 - 19_800_000; // 2026-11-22T00:00+05:30

    fn rec(time_ms: i64, model: &str, status: u16, tokens: u64, latency_ms: u64) -> UsageRecord {
        UsageRecord {
            time_ms,
            request_id: format!("req_{time_ms}"),
            key_id: "k".into(),
            listener: "direct".into(),
            endpoint: "chat".into(),
            model: model.into(),
            status,
            stream: false,
            prompt_tokens: tokens,
            completion_tokens: tokens,
            total_tokens: 2 * tokens,
            cost: 0.5,
            latency_ms,
            ttft_ms: None,
            upstream: String::new(),
            estimated: false,
            attempts: 1,
            served_model: String::new(),
            cut: String::new(),
            ..Default::default()
        }
    }

    /// A range with more models than a summary lists: the top `TOP - 1` by cost one by one,
    /// the rest summed as `(other)`, the totals whole.
    #[test]
    fn a_summary_lists_at_most_top_models_and_sums_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("u.db"), StoreOptions::default()).unwrap();
        let n = TOP + 50;
        for i in 0..n {
            let mut r = rec(MIDNIGHT_IST + i as i64, &format!("m-{i:03}"), 200, 1, 20);
            // Model i costs more the larger i is: the first 51 are the rest.
            r.cost = i as f64;
            store.record(r);
        }
        assert!(store.flush(Duration::from_secs(10)));
        let range = parse_range(Some("start=2026-11-21&end=2026-11-24&tz=UTC"), 0, false).unwrap();
        let q = RollupQuery {
            key_id: Some("k".into()),
            start_ms: range.start_ms,
            end_ms: range.end_ms,
            model: None,
        };
        let v = compute(&store.rollup(&q).unwrap(), &range).unwrap();
        let models = v["models"].as_array().unwrap();
        assert_eq!(models.len(), TOP);
        assert_eq!(models[0]["model"], format!("m-{:03}", n - 1));
        let other = &models[TOP - 1];
        assert_eq!(other["model"], OTHER);
        assert_eq!(other["requests"], 51);
        assert_eq!(other["cost"], (0..51).sum::<usize>() as f64);
        assert!(other["latency_p50_ms"].as_u64().is_some(), "{other}");
        assert_eq!(v["totals"]["requests"], n);
        let keys = v["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1);
    }

    /// Records a minute either side of local midnights in IST: each local day adds up to exactly
    /// its own records, and the totals to all of them.
    #[test]
    fn an_ist_day_adds_up_to_its_own_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("u.db"), StoreOptions::default()).unwrap();
        let min = 60_000;
        let times = [
            MIDNIGHT_IST - min,           // 21 Nov, 23:59 IST
            MIDNIGHT_IST,                 // 22 Nov, 00:00 IST
            MIDNIGHT_IST + 7 * 3_600_000, // 22 Nov
            MIDNIGHT_IST + DAY_MS - 1,    // 22 Nov, 23:59:59.999 IST
            MIDNIGHT_IST + DAY_MS,        // 23 Nov
            MIDNIGHT_IST + DAY_MS + min,  // 23 Nov
        ];
        for (i, t) in times.iter().enumerate() {
            let status = if i == 2 { 429 } else { 200 };
            store.record(rec(*t, if i % 2 == 0 { "a" } else { "b" }, status, 10, 100));
        }
        assert!(store.flush(Duration::from_secs(10)));
        let range = parse_range(
            Some("start=2026-11-21&end=2026-11-24&tz=Asia/Kolkata&bucket=day"),
            0,
            false,
        )
        .unwrap();
        assert_eq!(range.start_ms, MIDNIGHT_IST - DAY_MS);
        let q = RollupQuery {
            key_id: Some("k".into()),
            start_ms: range.start_ms,
            end_ms: range.end_ms,
            model: None,
        };
        let v = compute(&store.rollup(&q).unwrap(), &range).unwrap();
        let days: Vec<(String, u64)> = v["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["start"].as_str().unwrap().to_string(),
                    b["requests"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            days,
            vec![
                ("2026-11-21T00:00:00+05:30".to_string(), 1),
                ("2026-11-22T00:00:00+05:30".to_string(), 3),
                ("2026-11-23T00:00:00+05:30".to_string(), 2),
            ]
        );
        assert_eq!(v["totals"]["requests"], 6);
        assert_eq!(v["totals"]["succeeded"], 5);
        assert_eq!(v["totals"]["total_tokens"], 120);
        assert_eq!(v["totals"]["cost"], 3.0);
        let p50 = v["totals"]["latency_p50_ms"].as_u64().unwrap();
        assert!(
            (95..=105).contains(&p50),
            "{p50}: within the histogram's 5%"
        );
        assert_eq!(v["range"]["tz"], "Asia/Kolkata");
        let models = v["models"].as_array().unwrap();
        assert_eq!(models.len(), 2);
        assert_eq!(
            models[0]["requests"].as_u64().unwrap() + models[1]["requests"].as_u64().unwrap(),
            6
        );
        // The same range in UTC days splits the records differently.
        let utc = parse_range(
            Some(
                "start=2026-11-21T00:00:00%2B05:30&end=2026-11-24T00:00:00+05:30&tz=UTC&bucket=day",
            ),
            0,
            false,
        )
        .unwrap();
        assert_eq!((utc.start_ms, utc.end_ms), (range.start_ms, range.end_ms));
        // An offset's `+` sent unencoded (a space once decoded) is still an offset.
        let plus = parse_range(
            Some("start=2026-11-21T00:00:00%2B05:30&end=2026-11-24T00:00:00+05:30&tz=+05:30"),
            0,
            false,
        )
        .unwrap();
        assert_eq!(plus.tz_name, "+05:30");
        let v = compute(&store.rollup(&q).unwrap(), &utc).unwrap();
        let per_day: Vec<u64> = v["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["requests"].as_u64().unwrap())
            .collect();
        assert_eq!(per_day.iter().sum::<u64>(), 6);
        assert_eq!(v["buckets"][0]["start"], "2026-11-20T00:00:00+00:00");
    }

    #[test]
    fn buckets_follow_the_zone_and_are_bounded() {
        let r = parse_range(
            Some("start=2026-03-07&end=2026-03-10&tz=America/New_York&bucket=day"),
            0,
            false,
        )
        .unwrap();
        let starts = bucket_starts(&r).unwrap();
        assert_eq!(starts.len(), 3);
        // 8 March 2026 is 23 hours long in New York (DST starts).
        assert_eq!(starts[2] - starts[1], 23 * 3_600_000);
        let r = parse_range(Some("start=2026-01-01&end=2026-11-01&bucket=15m"), 0, false).unwrap();
        assert_eq!(bucket_starts(&r).unwrap_err().status(), 400);
        let r = parse_range(
            Some("start=2026-11-22T10:07:00Z&end=2026-11-22T11:00:00Z"),
            0,
            false,
        )
        .unwrap();
        assert_eq!(r.bucket, Bucket::Quarter);
        let starts = bucket_starts(&r).unwrap();
        assert_eq!(
            starts[0], 1_795_341_600_000,
            "10:00Z, the quarter holding the start"
        );
        assert_eq!(starts.len(), 4);
        assert!(parse_range(Some("bucket=year"), 0, false).is_err());
        // Weeks from Monday 00:00 local (Wednesday 4 March 2026 is in the week of the 2nd),
        // a week across the DST change 167 hours long.
        let r = parse_range(
            Some("start=2026-03-04&end=2026-03-20&tz=America/New_York&bucket=week"),
            0,
            false,
        )
        .unwrap();
        let starts = bucket_starts(&r).unwrap();
        let day = |ms: i64, tz: &TimeZone| {
            jiff::Timestamp::from_millisecond(ms)
                .unwrap()
                .to_zoned(tz.clone())
                .to_string()
        };
        assert!(
            day(starts[0], &r.tz).starts_with("2026-03-02T00:00:00-05:00"),
            "{}",
            day(starts[0], &r.tz)
        );
        assert_eq!(starts.len(), 3);
        assert_eq!(starts[1] - starts[0], 167 * 3_600_000);
        // Ten years: more days than a chart takes, so auto gives months.
        let r = parse_range(Some("start=2016-01-15&end=2026-01-15"), 0, false).unwrap();
        assert_eq!(r.bucket, Bucket::Month);
        let starts = bucket_starts(&r).unwrap();
        assert_eq!(starts.len(), 121);
        assert!(
            day(starts[1], &r.tz).starts_with("2016-02-01T00:00:00"),
            "{}",
            day(starts[1], &r.tz)
        );
    }
}
