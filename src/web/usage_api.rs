//! `GET /api/usage` and `/api/usage.csv`: the bearer key's own usage records. JSON pages with
//! a cursor; CSV streamed as it is read from the store (constant memory however many rows).
//! Reads run on blocking threads so the proxy's runtime never waits on SQLite.

use std::sync::Arc;

use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use serde_json::json;

use super::{Exchange, blocking, fail, params, store_failed};
use crate::config::keys::Key;
use crate::error::GatewayError;
use crate::store::record::format_time;
use crate::store::{Cursor, Query, Store};
use crate::web::Web;

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 10_000;
const DAY_MS: i64 = 24 * 3600 * 1000;

const PAGE_PARAMS: [&str; 9] = [
    "start", "end", "tz", "limit", "cursor", "order", "model", "status", "key_id",
];
const CSV_PARAMS: [&str; 7] = ["start", "end", "tz", "order", "model", "status", "key_id"];

/// Parses the usage query: `start`/`end` (end exclusive, default the last 24 h; RFC 3339, unix
/// seconds or `YYYY-MM-DD` in `tz`), `limit`, `cursor`, `order=asc|desc`, `model`, `status`
/// (`429` or a class such as `5xx`). Unknown parameters are refused. With no `key_id` (the
/// console), every key's records, or one key's with `key_id=`; a key's own query may not
/// name one.
pub fn parse_query(
    query: Option<&str>,
    key_id: Option<&str>,
    now_ms: i64,
    csv: bool,
) -> Result<Query, GatewayError> {
    let bad =
        |param: &'static str, message: String| GatewayError::InvalidParameter { param, message };
    let allowed: &[&'static str] = match (csv, key_id.is_some()) {
        (false, console) => &PAGE_PARAMS[..PAGE_PARAMS.len() - usize::from(console)],
        (true, console) => &CSV_PARAMS[..CSV_PARAMS.len() - usize::from(console)],
    };
    let pairs = params::parse(query, allowed)?;
    let tz = match pairs.iter().find(|(k, _)| *k == "tz") {
        Some((_, v)) => params::zone(v)?,
        None => jiff::tz::TimeZone::UTC,
    };
    let mut q = Query {
        key_id: key_id.map(str::to_string),
        limit: DEFAULT_LIMIT,
        ..Query::default()
    };
    let (mut start, mut end) = (None, None);
    for (k, v) in pairs {
        match k {
            "start" => start = Some(params::time("start", &v, &tz)?),
            "end" => end = Some(params::time("end", &v, &tz)?),
            "limit" => {
                q.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| bad("limit", format!("limit must be 1..={MAX_LIMIT}")))?;
            }
            "cursor" => {
                q.cursor =
                    Some(Cursor::decode(&v).ok_or_else(|| bad("cursor", "unknown cursor".into()))?)
            }
            "order" => {
                q.desc = match v.as_str() {
                    "asc" => false,
                    "desc" => true,
                    _ => {
                        return Err(bad(
                            "order",
                            format!("order is asc or desc, not '{}'", params::shown(&v)),
                        ));
                    }
                }
            }
            "model" => q.model = Some(v),
            "key_id" => q.key_id = Some(v),
            "status" => {
                q.status = Some(status_range(&v).ok_or_else(|| {
                    bad(
                        "status",
                        format!(
                            "'{}' is not a status: use a code such as 429 or a class such as 5xx",
                            params::shown(&v)
                        ),
                    )
                })?)
            }
            _ => {}
        }
    }
    q.end_ms = end.unwrap_or(now_ms.saturating_add(1));
    q.start_ms = start.unwrap_or(q.end_ms.saturating_sub(DAY_MS));
    if q.start_ms > q.end_ms {
        return Err(bad("start", "start is after end".into()));
    }
    Ok(q)
}

/// `429` → (429, 429); `4xx` → (400, 499).
fn status_range(v: &str) -> Option<(u16, u16)> {
    let v = v.trim().to_ascii_lowercase();
    if let Some(class) = v.strip_suffix("xx") {
        let c: u16 = class.parse().ok().filter(|c| (1..=5).contains(c))?;
        return Some((c * 100, c * 100 + 99));
    }
    let code: u16 = v.parse().ok().filter(|c| (100..=599).contains(c))?;
    Some((code, code))
}

/// Answers `/api/usage` or `/api/usage.csv` with the key's own records.
pub async fn answer(
    web: &Web,
    session: &mut Session,
    ex: &mut Exchange,
    key: &Key,
    csv: bool,
) -> pingora_error::Result<()> {
    let query = match parse_query(
        session.req_header().uri.query(),
        Some(&key.id),
        super::now_ms(),
        csv,
    ) {
        Ok(q) => q,
        Err(e) => return fail(session, ex, &e).await,
    };
    if csv {
        send_csv(session, ex, web, query).await
    } else {
        send_page(session, ex, &web.store, query).await
    }
}

pub async fn send_page(
    session: &mut Session,
    ex: &mut Exchange,
    store: &Arc<Store>,
    query: Query,
) -> pingora_error::Result<()> {
    let s = store.clone();
    match blocking(move || s.query(&query)).await {
        Ok(page) => {
            let data: Vec<serde_json::Value> = page.records.iter().map(|r| r.to_json()).collect();
            let body = json!({
                "object": "list",
                "data": data,
                "has_more": page.next_cursor.is_some(),
                "next_cursor": page.next_cursor.map(|c| c.encode()),
            });
            super::json(session, ex, &body).await
        }
        Err(e) => fail(session, ex, &store_failed(&ex.request_id, &e)).await,
    }
}

/// `usage-<key>-<start>-<end>.csv`, times in compact UTC (`20261122T000000Z`).
pub fn csv_filename(query: &Query) -> String {
    let t = |ms| {
        format_time(ms)
            .replace(['-', ':'], "")
            .split('.')
            .next()
            .unwrap_or_default()
            .to_string()
            + "Z"
    };
    let key: String = query
        .key_id
        .as_deref()
        .unwrap_or("all")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("usage-{key}-{}-{}.csv", t(query.start_ms), t(query.end_ms))
}

pub async fn send_csv(
    session: &mut Session,
    ex: &mut Exchange,
    web: &Web,
    query: Query,
) -> pingora_error::Result<()> {
    let mut h = ResponseHeader::build(200, Some(4))?;
    h.insert_header("content-type", "text/csv; charset=utf-8")?;
    h.insert_header(
        "content-disposition",
        format!("attachment; filename=\"{}\"", csv_filename(&query)),
    )?;
    h.insert_header("x-request-id", ex.request_id.as_str())?;
    h.insert_header("cache-control", "no-store")?;
    crate::web::cors::decorate(&mut h, ex.cors.as_ref())?;
    crate::http1::respond::frame_unknown_length(session.req_header(), &mut h)?;
    // A client that reads slowly holds a write, a long query the next chunk: the client's
    // send timeout ends the one, the shutdown's cut either (and the export) all the same, so
    // its record is written before the exit.
    let life = ex.life.clone();
    let bound = crate::http1::respond::Bound {
        limit: ex.send_timeout,
        life: life.as_deref(),
    };
    // HEAD: the header alone, and no export run (over HTTP/2 a body would go out as DATA).
    if session.req_header().method == http::Method::HEAD {
        return crate::http1::respond::header(session, &mut ex.sent, bound, Box::new(h), true)
            .await;
    }
    crate::http1::respond::header(session, &mut ex.sent, bound, Box::new(h), false).await?;
    // A small channel between the blocking reader and this task: memory stays a few chunks.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let s = web.store.clone();
    let reader = tokio::task::spawn_blocking(move || {
        s.export_csv(&query, &mut |chunk| tx.blocking_send(chunk).is_ok())
    });
    loop {
        let next = tokio::select! {
            biased;
            c = tokio::time::timeout(super::STORE_READ_LIMIT, rx.recv()) => c,
            () = crate::ops::lifecycle::cut(bound.life) => return Err(crate::http1::respond::shutdown_cut()),
        };
        let Ok(next) = next else {
            let e = crate::store::StoreError(format!(
                "usage store: no rows within {} s",
                super::STORE_READ_LIMIT.as_secs()
            ));
            return export_failed(session, ex, &e);
        };
        let Some(chunk) = next else { break };
        let write = crate::http1::respond::body(session, &mut ex.sent, bound, Some(chunk), false);
        if let Err(e) = write.await {
            // The reader stops at its next chunk (the channel is gone); not waited for.
            drop(rx);
            return Err(e);
        }
    }
    let done = reader.await.unwrap_or_else(|e| {
        Err(crate::store::StoreError(format!(
            "usage store: export task: {e}"
        )))
    });
    match done {
        Ok(_rows) => {
            crate::http1::respond::body(session, &mut ex.sent, bound, Some(Bytes::new()), true)
                .await
        }
        Err(e) => export_failed(session, ex, &e),
    }
}

/// An export that failed after its header went: all that is left is to cut the reply so it
/// cannot look complete. An error ends it without its final chunk (a return would finish it).
fn export_failed(
    session: &mut Session,
    ex: &mut Exchange,
    e: &crate::store::StoreError,
) -> pingora_error::Result<()> {
    tracing::error!(request_id = %ex.request_id, "usage export failed: {e}");
    session.as_downstream_mut().set_keepalive(None);
    Err(pingora_error::Error::explain(
        pingora_error::ErrorType::InternalError,
        "the usage export failed",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_range_is_the_last_24_hours_end_exclusive() {
        let q = parse_query(None, Some("k"), 100 * DAY_MS, false).expect("ok");
        assert_eq!((q.start_ms, q.end_ms), (99 * DAY_MS + 1, 100 * DAY_MS + 1));
        assert_eq!(q.limit, DEFAULT_LIMIT);
        assert_eq!(q.key_id.as_deref(), Some("k"));
    }

    #[test]
    fn start_and_end_take_rfc3339_or_unix_seconds() {
        let q = parse_query(
            Some("start=2026-11-22T00%3A00%3A00Z&end=1795400000&limit=5"),
            None,
            0,
            false,
        )
        .expect("ok");
        assert_eq!(q.start_ms, 1_795_305_600_000);
        assert_eq!(q.end_ms, 1_795_400_000_000);
        assert_eq!(q.limit, 5);
    }

    #[test]
    fn bad_values_and_keys_in_the_url_are_refused() {
        for q in [
            "start=yesterday",
            "limit=0",
            "limit=10001",
            "cursor=zzz",
            "api_key=sk-x",
            "start=20&end=10",
            "start=1795400000000",
            "order=up",
            "status=6xx",
            "status=abc",
            "tz=Mars/Base",
            "limit=5&colour=red",
        ] {
            assert!(parse_query(Some(q), None, 0, false).is_err(), "{q}");
        }
        assert!(
            parse_query(Some("limit=5"), None, 0, true).is_err(),
            "no limit on CSV"
        );
    }

    #[test]
    fn order_filters_and_dates_in_a_zone() {
        let q = parse_query(
            Some("start=2026-11-22&end=2026-11-23&tz=Asia/Kolkata&order=desc&model=echo-1&status=4xx"),
            None,
            0,
            false,
        )
        .expect("ok");
        assert_eq!(q.start_ms, 1_795_305_600_000 - 19_800_000);
        assert_eq!(q.end_ms - q.start_ms, DAY_MS);
        assert!(q.desc);
        assert_eq!(q.model.as_deref(), Some("echo-1"));
        assert_eq!(q.status, Some((400, 499)));
        assert_eq!(
            csv_filename(&q),
            "usage-all-20261121T183000Z-20261122T183000Z.csv"
        );
    }
}
