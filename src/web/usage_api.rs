//! `GET /api/usage` and `/api/usage.csv`: the bearer key's own usage records. JSON pages with
//! a cursor; CSV streamed as it is read from the store (constant memory however many rows).
//! Reads run on blocking threads so the proxy's runtime never waits on SQLite.

use std::sync::Arc;

use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use serde_json::json;

use crate::error::GatewayError;
use crate::proxy::ctx::Ctx;
use crate::proxy::respond;
use crate::store::record::parse_time;
use crate::store::{Cursor, Query, Store};

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 10_000;
const DAY_MS: i64 = 24 * 3600 * 1000;

/// Parses `start`, `end`, `limit`, `cursor`; `end` exclusive, default the last 24 h.
pub fn parse_query(
    query: Option<&str>,
    key_id: Option<&str>,
    now_ms: i64,
) -> Result<Query, GatewayError> {
    let bad =
        |param: &'static str, message: String| GatewayError::InvalidParameter { param, message };
    let (mut start, mut end, mut limit, mut cursor) = (None, None, DEFAULT_LIMIT, None);
    if crate::auth::key_in_query(query) {
        let message = "Keys are read only from 'Authorization: Bearer', never from the URL.";
        return Err(bad("api_key", message.into()));
    }
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "start" => {
                start = Some(parse_time(&v).ok_or_else(|| {
                    bad("start", format!("'{v}' is not RFC 3339 or unix seconds"))
                })?)
            }
            "end" => {
                end =
                    Some(parse_time(&v).ok_or_else(|| {
                        bad("end", format!("'{v}' is not RFC 3339 or unix seconds"))
                    })?)
            }
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| bad("limit", format!("limit must be 1..={MAX_LIMIT}")))?;
            }
            "cursor" => {
                cursor =
                    Some(Cursor::decode(&v).ok_or_else(|| bad("cursor", "unknown cursor".into()))?)
            }
            _ => {}
        }
    }
    let end_ms = end.unwrap_or(now_ms.saturating_add(1));
    let start_ms = start.unwrap_or(end_ms.saturating_sub(DAY_MS));
    if start_ms > end_ms {
        return Err(bad("start", "start is after end".into()));
    }
    Ok(Query {
        key_id: key_id.map(str::to_string),
        start_ms,
        end_ms,
        limit,
        cursor,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Answers a usage request for `key_id`'s records (or every key's when None: console).
pub async fn answer(
    session: &mut Session,
    ctx: &mut Ctx,
    store: &Arc<Store>,
    key_id: &str,
    csv: bool,
) -> pingora_error::Result<()> {
    let query = match parse_query(session.req_header().uri.query(), Some(key_id), now_ms()) {
        Ok(q) => q,
        Err(e) => return respond::error(session, ctx, &e).await,
    };
    if csv {
        send_csv(session, ctx, store, query).await
    } else {
        send_page(session, ctx, store, query).await
    }
}

pub async fn send_page(
    session: &mut Session,
    ctx: &mut Ctx,
    store: &Arc<Store>,
    query: Query,
) -> pingora_error::Result<()> {
    let s = store.clone();
    let page = tokio::task::spawn_blocking(move || s.query(&query)).await;
    match page {
        Ok(Ok(page)) => {
            let data: Vec<serde_json::Value> = page.records.iter().map(|r| r.to_json()).collect();
            let body = json!({
                "object": "list",
                "data": data,
                "has_more": page.next_cursor.is_some(),
                "next_cursor": page.next_cursor.map(|c| c.encode()),
            });
            respond::json(session, ctx, 200, body.to_string().into_bytes()).await
        }
        Ok(Err(e)) => {
            respond::error(
                session,
                ctx,
                &GatewayError::Internal(format!("usage store: {e}")),
            )
            .await
        }
        Err(e) => {
            respond::error(
                session,
                ctx,
                &GatewayError::Internal(format!("usage store: {e}")),
            )
            .await
        }
    }
}

pub async fn send_csv(
    session: &mut Session,
    ctx: &mut Ctx,
    store: &Arc<Store>,
    query: Query,
) -> pingora_error::Result<()> {
    let filename = format!(
        "usage-{}-{}.csv",
        query.key_id.as_deref().unwrap_or("all"),
        crate::store::record::format_time(query.start_ms).replace([':', '.'], "")
    );
    let mut h = ResponseHeader::build(200, Some(4))?;
    h.insert_header("content-type", "text/csv; charset=utf-8")?;
    h.insert_header(
        "content-disposition",
        format!("attachment; filename=\"{}\"", filename.replace('"', "")),
    )?;
    h.insert_header("x-request-id", ctx.request_id.as_str())?;
    h.insert_header("cache-control", "no-store")?;
    crate::limit::rate::write_headers(&ctx.headroom, &mut h)?;
    ctx.status = 200;
    session.write_response_header(Box::new(h), false).await?;
    // A small channel between the blocking reader and this task: memory stays a few chunks.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let s = store.clone();
    let reader = tokio::task::spawn_blocking(move || {
        s.export_csv(&query, &mut |chunk| tx.blocking_send(chunk).is_ok())
    });
    while let Some(chunk) = rx.recv().await {
        if let Err(e) = session.write_response_body(Some(chunk), false).await {
            ctx.status = 499;
            drop(rx);
            let _ = reader.await;
            return Err(e);
        }
    }
    match reader.await {
        Ok(Ok(_rows)) => session.write_response_body(Some(Bytes::new()), true).await,
        _ => {
            // The header is out: all that is left is to cut the reply so it cannot look complete.
            ctx.status = 500;
            session.as_downstream_mut().set_keepalive(None);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_range_is_the_last_24_hours_end_exclusive() {
        let q = parse_query(None, Some("k"), 100 * DAY_MS).expect("ok");
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
        ] {
            assert!(parse_query(Some(q), None, 0).is_err(), "{q}");
        }
    }
}
