//! What a request sends to one route's pool: the body (the client's with the upstream's model
//! name and the reservation's output limit spliced in, or translated into the pool's API),
//! how the reply is metered (in the API the pool speaks) and translated back, and the path it
//! goes to. Made for the route first asked and again for each fallback taken.

use std::borrow::Cow;

use super::ctx::{Ctx, Sending};
use crate::error::GatewayError;
use crate::meter::Meter;
use crate::meter::sse::{Dialect, SseMeter};
use crate::route::Route;
use crate::route::body as route_body;
use crate::route::endpoint::Metering;
use crate::translate::{self, Api};

/// Sets up `ctx` to send the request to `route`, served as `id`: its body, meter, translation
/// and upstream path. Err: the pool cannot take it (an API its provider has no equivalent of).
pub fn for_route(ctx: &mut Ctx, s: &Sending, route: &Route, id: &str) -> Result<(), GatewayError> {
    let metering = crate::meter::enabled();
    let stream = s.probe.stream;
    let rename = route.upstream_rename(id, &s.probe.model);
    match translate::plan(s.endpoint.api, &route.pool.cfg)? {
        None => {
            // Streams are metered from their events; ask the upstream for usage if the client
            // did not (and hide it from the client again, see meter/sse.rs).
            let ask_usage = metering
                && stream
                && s.endpoint.metering == Metering::Chat
                && !s.probe.include_usage;
            ctx.meter = meter(s.endpoint.metering, stream, ask_usage, metering);
            ctx.body = route_body::for_upstream_limited(
                &s.body,
                &s.probe,
                rename.as_deref(),
                ask_usage,
                s.limit,
            );
            ctx.translation = None;
            ctx.upstream_path = None;
        }
        // Token counting has no translation: the gateway has no count of another API's.
        Some(_) if s.endpoint.metering == Metering::Free => {
            return Err(GatewayError::Unsupported {
                param: "model",
                message: format!(
                    "The pool of this model ('{}') does not count tokens in this API.",
                    route.pool.name
                ),
            });
        }
        Some(plan) => {
            let model = rename.unwrap_or(Cow::Borrowed(&s.probe.model));
            let asked = translate::Asked {
                body: &s.body,
                model: &model,
                cap: s.limit.map(|(n, _)| n),
                default_max_tokens: route.model.max_output_tokens,
                drop: &route.pool.cfg.drop_params,
            };
            let (body, translation) = translate::request(plan, &asked)?;
            let metering_of = match plan.to {
                Api::Messages => Metering::Messages,
                _ => Metering::Chat,
            };
            ctx.meter = meter(metering_of, stream, false, metering);
            ctx.body = body;
            ctx.translation = Some(Box::new(translation));
            ctx.upstream_path = Some(plan.path());
        }
    }
    if let Some(n) = s.cut_at {
        ctx.meter.cut_after(n);
    }
    Ok(())
}

/// How a reply of `metering` is metered; `ask_usage`: the gateway asked a chat stream's
/// usage for the client.
fn meter(metering: Metering, stream: bool, ask_usage: bool, on: bool) -> Meter {
    let sse = |m: SseMeter| Meter::Sse(Box::new(m));
    match metering {
        _ if !on => Meter::None,
        Metering::Chat if stream => sse(SseMeter::new(ask_usage)),
        Metering::Responses if stream => sse(SseMeter::of(Dialect::Responses)),
        Metering::Messages if stream => sse(SseMeter::of(Dialect::Messages)),
        Metering::Chat | Metering::Usage | Metering::Responses | Metering::Messages => {
            Meter::json()
        }
        // A stream of another endpoint counts the usage its events report, as a plain reply
        // does; it is passed on as it came (no `[DONE]` of the gateway's).
        Metering::Reported if stream => sse(SseMeter::reported()),
        Metering::Reported => Meter::json_reported(),
        Metering::PerRequest | Metering::Free => Meter::None,
    }
}
