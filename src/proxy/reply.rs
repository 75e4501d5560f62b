//! The upstream's reply on its way to the client: header fix-ups and the body filter. Shared by
//! Pingora's proxy path and the direct path so both treat replies the same.

use bytes::Bytes;
use pingora_error::{Error, ErrorSource, ErrorType};
use pingora_http::ResponseHeader;

use super::ctx::Ctx;
use crate::config::headers::{PassHeaders, REQUEST_IDS};
use crate::error::GatewayError;
use crate::meter::Meter;

/// A reply header that belongs to the upstream's hop only, as a static name.
fn hop_by_hop(name: &str) -> Option<&'static str> {
    Some(match name {
        "connection" => "connection",
        "keep-alive" => "keep-alive",
        "proxy-connection" => "proxy-connection",
        "proxy-authenticate" => "proxy-authenticate",
        "te" => "te",
        "trailer" => "trailer",
        "transfer-encoding" => "transfer-encoding",
        "upgrade" => "upgrade",
        _ => return None,
    })
}

/// The upstream's reply header as the gateway's own to its client (RFC 9110 §7.6.1). It keeps
/// what describes the content (`content-*`, caching validators, `retry-after`) and the headers
/// the pool names in `pass_headers`; what the upstream says about itself (`server`, `via`,
/// cookies, org and project ids, `alt-svc`, its CORS: CORS is the gateway's) stays with the
/// gateway, as do its framing, its connection's options and every header its `Connection`
/// names. The provider's own request id goes on as `x-upstream-request-id` (not the gateway's
/// own, which some servers echo), and is returned (for the access log). It is an HTTP/1.1
/// reply whatever the upstream spoke.
fn keep_for_client(
    resp: &mut ResponseHeader,
    pass: &PassHeaders,
    ours: &str,
) -> pingora_error::Result<Option<http::HeaderValue>> {
    resp.set_version(http::Version::HTTP_11);
    let hop = crate::upstream::HopHeaders::of(&resp.headers, hop_by_hop);
    let mut upstream_id: Option<(usize, http::HeaderValue)> = None;
    let mut dropped: Vec<http::HeaderName> = Vec::new();
    for (name, value) in &resp.headers {
        let n = name.as_str();
        if let Some(rank) = REQUEST_IDS.iter().position(|id| *id == n) {
            // A server that echoes the `x-request-id` it was sent gives back the gateway's.
            let echoed = value.as_bytes() == ours.as_bytes();
            if !echoed && upstream_id.as_ref().is_none_or(|(r, _)| rank < *r) {
                upstream_id = Some((rank, value.clone()));
            }
        }
        let kept = pass.keeps(n) && !REQUEST_IDS.contains(&n) && !hop.names().any(|h| h == n);
        if !kept && dropped.last() != Some(name) {
            dropped.push(name.clone());
        }
    }
    for name in dropped {
        resp.remove_header(&name);
    }
    let upstream_id = upstream_id.map(|(_, id)| id);
    if let Some(id) = &upstream_id {
        resp.insert_header("x-upstream-request-id", id.clone())?;
    }
    Ok(upstream_id)
}

/// Upstream 401/403 mean the gateway's own credential failed: the client gets 502
/// `upstream_error` instead of a misleading auth error. That is an error returned here, before
/// the client's header is written, so `fail_to_proxy` answers it whole — also when the
/// upstream's refusal has no body. Every reply gets `x-request-id`.
pub fn on_upstream_header(
    ctx: &mut Ctx,
    resp: &mut ResponseHeader,
    pass: &PassHeaders,
) -> pingora_error::Result<()> {
    match resp.status.as_u16() {
        401 => {
            return Err(Error::explain(
                ErrorType::Custom(UPSTREAM_401),
                "upstream refused the pool's credential",
            )
            .into_up());
        }
        403 => {
            return Err(Error::explain(
                ErrorType::Custom(UPSTREAM_403),
                "upstream refused the pool's credential",
            )
            .into_up());
        }
        _ => {}
    }
    // The upstream's rate-limit headers describe the pool's account, not the client's key:
    // they are not kept, and the key's own (if it has limits) are written.
    ctx.upstream_request_id = keep_for_client(resp, pass, &ctx.request_id)?;
    resp.insert_header("x-request-id", ctx.request_id.as_str())?;
    super::respond::reply_headers(&ctx.decor(), resp)?;
    if ctx.reservation.as_ref().is_some_and(|r| r.budget_limited) {
        // The output limit was lowered to what the budget can pay.
        resp.insert_header("x-modelgate-budget-limited", "true")?;
    }
    if resp.status.is_success() && is_json(resp) {
        // A stream request answered with a plain reply: metered from its `usage`.
        ctx.meter.plain_reply();
    }
    if resp.status.is_success() && (ctx.meter.is_metered() || ctx.translation.is_some()) {
        // Compressed anyway: metered (and translated) from a decoded copy.
        ctx.decoder = resp
            .headers
            .get(http::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::meter::decode::Decoder::for_coding)
            .map(Box::new);
    }
    if !resp.status.is_success() {
        // An error reply carries no usage; it passes through unmetered.
        ctx.meter = Meter::None;
    } else if ctx.meter.is_metered() && is_web_page(resp) {
        // A web page where the API's reply belongs (a proxy's login or error page, a host
        // that is not the model server): garbage, 502, never passed on as a success.
        return Err(Error::explain(
            ErrorType::Custom(UPSTREAM_PAGE),
            "the upstream answered a web page",
        )
        .into_up());
    } else if ctx.meter.edits_body() {
        // Events are edited on the way (usage stripped, a cut by the budget): the length is no
        // longer known, and a compressed stream goes on decoded, as edited.
        resp.remove_header(&http::header::CONTENT_LENGTH);
        if ctx.decoder.is_some() && ctx.translation.is_none() {
            resp.remove_header(&http::header::CONTENT_ENCODING);
        }
    }
    if let (true, Some(t)) = (resp.status.is_success(), ctx.translation.as_mut()) {
        t.on_header(resp)?;
    }
    Ok(())
}

/// Called for each piece of the reply body as it passes: the meter, which may edit streamed
/// events; notes when content first reaches the client.
pub fn on_body(ctx: &mut Ctx, body: &mut Option<Bytes>, end: bool) {
    let content = match ctx.decoder.as_mut() {
        // The meter reads (and may edit) a decoded copy; the bytes pass on unchanged, unless
        // they are translated (from the decoded copy) or edited (`on_header` dropped their
        // coding then).
        Some(d) => {
            let mut decoded = body.as_ref().map(|b| Bytes::from(d.decode(b)));
            let content = ctx.meter.feed(&mut decoded, end);
            if ctx.translation.is_some() || ctx.meter.edits_body() {
                *body = decoded;
            }
            content
        }
        None => ctx.meter.feed(body, end),
    };
    if let Some(t) = ctx.translation.as_mut() {
        let out = t.feed(body.as_deref(), end);
        *body = (!out.is_empty() || end).then_some(out);
    }
    if content && ctx.ttft_ms.is_none() {
        ctx.ttft_ms = Some(ctx.started.elapsed().as_millis() as u64);
    }
}

const UPSTREAM_401: &str = "upstream answered 401";
const UPSTREAM_PAGE: &str = "upstream answered a web page";

fn is_json(resp: &ResponseHeader) -> bool {
    resp.headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| {
            v.as_bytes().len() >= 16 && v.as_bytes()[..16].eq_ignore_ascii_case(b"application/json")
        })
}

fn is_web_page(resp: &ResponseHeader) -> bool {
    resp.headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| {
            v.as_bytes().len() >= 9 && v.as_bytes()[..9].eq_ignore_ascii_case(b"text/html")
        })
}
const UPSTREAM_403: &str = "upstream answered 403";

/// The gateway error for a failure while proxying, or None when the client itself went away
/// (nobody to answer).
pub fn classify_failure(e: &Error) -> Option<GatewayError> {
    use ErrorType::*;
    if crate::http1::respond::is_shutdown_cut(e) {
        return Some(GatewayError::ShuttingDown);
    }
    let what = || format!("upstream failed: {}", e.etype().as_str());
    Some(match e.etype() {
        Custom(code @ (UPSTREAM_401 | UPSTREAM_403)) => GatewayError::UpstreamError(format!(
            "The upstream refused the gateway's credential ({code}); check the pool's api_key."
        )),
        Custom(UPSTREAM_PAGE) => GatewayError::UpstreamError(
            "The upstream answered with a web page (text/html), not the API's reply.".into(),
        ),
        // No connection within `connect_timeout_ms` (a host that drops the SYN, a full
        // backlog): the upstream is unreachable, 502 like a refused connect, not "too slow".
        ConnectTimedout | TLSHandshakeTimedout if e.esource() != &ErrorSource::Downstream => {
            GatewayError::UpstreamError(format!(
                "The upstream could not be reached within its connect timeout ({}).",
                e.etype().as_str()
            ))
        }
        ReadTimedout | WriteTimedout if e.esource() != &ErrorSource::Downstream => {
            GatewayError::UpstreamTimeout(what())
        }
        HTTPStatus(413) => GatewayError::RequestTooLarge(0),
        _ => match e.esource() {
            ErrorSource::Upstream => GatewayError::UpstreamError(what()),
            ErrorSource::Downstream => match e.etype() {
                WriteError | ReadError | ConnectionClosed | ReadTimedout | WriteTimedout => {
                    return None;
                }
                _ => GatewayError::InvalidParameter {
                    param: "body",
                    message: format!("bad request: {}", e.etype().as_str()),
                },
            },
            ErrorSource::Internal | ErrorSource::Unset => {
                GatewayError::Internal(format!("internal error: {}", e.etype().as_str()))
            }
        },
    })
}
