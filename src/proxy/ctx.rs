//! Per-request state carried through the proxy phases: who is asking, where it goes, the body
//! that will be sent, and timings. One `Ctx` lives exactly as long as its request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;

pub use crate::config::Listener;
use crate::config::keys::Key;
use crate::limit::rate::{Headroom, Slot};
use crate::meter::Meter;
use crate::route::Route;

pub struct Ctx {
    pub request_id: String,
    pub started: Instant,
    /// Unix milliseconds at arrival: the record's `time`.
    pub time_ms: i64,
    pub listener: Listener,
    pub key: Option<Arc<Key>>,
    /// The record's `endpoint` group name ("" until known).
    pub group: &'static str,
    /// The model the client asked for.
    pub model: String,
    /// The route that answered (or was tried last): a fallback's once one was taken.
    pub route: Option<Arc<Route>>,
    /// The configured model the request was routed as (the client's choice, before any
    /// fallback): the metrics' `model` label, as the record's `model` is the client's.
    pub asked: Option<Arc<Route>>,
    /// Index of the upstream that answered (or was tried last) in the route's pool.
    pub upstream: usize,
    /// Tries it took upstream (0: never sent).
    pub attempts: u32,
    /// The models that take the request, in order, when the route's pool cannot answer.
    pub fallbacks: Option<Box<Fallbacks>>,
    /// The whole body as it will be sent upstream.
    pub body: Bytes,
    pub stream: bool,
    /// What went to the client, as the writer recorded it (`respond::Sent`): what the
    /// request's final status is settled from (`outcome::settle`).
    pub sent: crate::http1::respond::Sent,
    pub meter: Meter,
    /// The reply's translation into the client's API, when the pool speaks another.
    pub translation: Option<Box<crate::translate::Translation>>,
    /// Where a translated request goes upstream (the path of the pool's API).
    pub upstream_path: Option<&'static str>,
    /// A compressed reply (an upstream that ignored `Accept-Encoding: identity`): decoded for
    /// the meter only, the bytes pass on as they came.
    pub decoder: Option<Box<crate::meter::decode::Decoder>>,
    /// Time to the first content byte sent to the client.
    pub ttft_ms: Option<u64>,
    /// The upstream was asked (so a per-request price applies on success).
    pub proxied: bool,
    /// The upstream took the request: its success header came back, so it read the prompt,
    /// which counts even if no content follows (a reply cut or abandoned at once).
    pub accepted: bool,
    /// `on_client_gone = "finish"`: the upstream's reply to a client that left is read to its
    /// end, not sent, and metered (`relay::finish_unsent`).
    pub finish_when_gone: bool,
    /// The client left while its request was with the upstream and the gateway did not wait
    /// for the reply (`on_client_gone = "cancel"`): its prompt is billed, estimated.
    pub abandoned: bool,
    /// The call spends nothing, not even the per-request price (`Metering::Free`).
    pub free: bool,
    /// The key's limits as of this request, for the `x-ratelimit-*` headers.
    pub headroom: Headroom,
    /// One of the key's `max_concurrent` slots, freed when the request ends.
    pub slot: Option<Slot>,
    /// The same slot when it is counted in Redis across the fleet.
    pub lease: Option<crate::limit::shared::Lease>,
    /// What the request holds of its key's budget and tpm until it ends (`budget_mode =
    /// "reserve"`).
    pub reservation: Option<Box<crate::limit::reserve::Reservation>>,
    /// Why the reply was cut short ("" when it was not), settled with the status.
    pub cut: &'static str,
    /// The request's entry in the crash journal, open from auth to its record.
    pub journal: Option<crate::store::journal::Entry>,
    /// The record written to the journal before the reply's last byte: status and tokens.
    pub preclosed: Option<(u16, u64, u64)>,
    /// Counts the request as in flight until it ends (its record written); carries the
    /// shutdown's signal to end it.
    pub life: Option<crate::ops::lifecycle::InFlight>,
    /// `Access-Control-Allow-Origin` for this request's allowed `Origin` (CORS on).
    pub cors: Option<http::HeaderValue>,
    /// The error shape of the API the path speaks.
    pub shape: crate::error::ErrorShape,
    /// The upstream (index in the route's pool) that must answer: the one that made the
    /// stored response a `/v1/responses/{id}` call names.
    pub pinned: Option<usize>,
    /// Time on upstream tries and the reply, and in backoff waits between tries.
    pub upstream_time: std::time::Duration,
    pub waited: std::time::Duration,
    /// The code of the gateway's own 4xx refusal, for the metrics.
    pub refusal: Option<&'static str>,
    /// The W3C trace context (set as the request is read).
    pub trace: Option<crate::ops::telemetry::Trace>,
    /// The client's address, as the throttles count it (behind `trusted_proxies`), once the
    /// request came to auth.
    pub client: Option<std::net::IpAddr>,
    /// The request id the upstream gave its reply (for the access log).
    pub upstream_request_id: Option<http::HeaderValue>,
    /// The body was asked for: a client waiting on `Expect: 100-continue` got its `100`.
    pub body_asked: bool,
    /// `client_send_timeout_ms`: how long a reply write may wait on a client reading nothing.
    pub send_timeout: std::time::Duration,
    /// When a refusal was sent, if the connection then lingers to drain the upload.
    pub answered: Option<Instant>,
    /// The request went on in a task of its own (`detach`), with its state: this one is what
    /// was left in Pingora's request, whose end writes no record.
    pub detached: bool,
}

impl Ctx {
    pub fn new(listener: Listener) -> Ctx {
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Ctx::blank(listener, next_request_id(), Instant::now(), time_ms)
    }

    /// Moves the request's state out, to the task its reply goes on in (`detach`); what is
    /// left says so, and nothing else.
    pub fn hand_off(&mut self) -> Box<Ctx> {
        let mut left = Ctx::blank(self.listener, String::new(), self.started, self.time_ms);
        left.detached = true;
        Box::new(std::mem::replace(self, left))
    }

    fn blank(listener: Listener, request_id: String, started: Instant, time_ms: i64) -> Ctx {
        Ctx {
            request_id,
            started,
            time_ms,
            listener,
            key: None,
            group: "",
            model: String::new(),
            route: None,
            asked: None,
            upstream: 0,
            attempts: 0,
            fallbacks: None,
            body: Bytes::new(),
            stream: false,
            sent: crate::http1::respond::Sent::default(),
            meter: Meter::None,
            translation: None,
            upstream_path: None,
            decoder: None,
            ttft_ms: None,
            proxied: false,
            accepted: false,
            finish_when_gone: true,
            abandoned: false,
            free: false,
            headroom: Headroom::default(),
            slot: None,
            lease: None,
            reservation: None,
            cut: "",
            journal: None,
            preclosed: None,
            life: None,
            cors: None,
            shape: crate::error::ErrorShape::OpenAi,
            pinned: None,
            upstream_time: std::time::Duration::ZERO,
            waited: std::time::Duration::ZERO,
            refusal: None,
            client: None,
            upstream_request_id: None,
            body_asked: false,
            send_timeout: std::time::Duration::from_secs(60),
            answered: None,
            trace: None,
            detached: false,
        }
    }

    /// What bounds this request's writes to its client (see `respond::Bound`).
    pub fn bound(&self) -> crate::http1::respond::Bound<'_> {
        crate::http1::respond::Bound {
            limit: self.send_timeout,
            life: self.life.as_ref().map(crate::ops::lifecycle::InFlight::get),
        }
    }

    /// What every reply of this request carries besides `x-request-id`.
    pub fn decor(&self) -> Decor<'_> {
        Decor {
            trace: self.trace.as_ref(),
            headroom: &self.headroom,
            cors: self.cors.as_ref(),
        }
    }

    /// This request's reply as the writer writes it, and what its replies carry besides
    /// (`respond::reply_headers`).
    pub fn writing(&mut self) -> (crate::http1::respond::Writing<'_>, Decor<'_>) {
        let writing = crate::http1::respond::Writing {
            request_id: &self.request_id,
            bound: crate::http1::respond::Bound {
                limit: self.send_timeout,
                life: self.life.as_ref().map(crate::ops::lifecycle::InFlight::get),
            },
            sent: &mut self.sent,
        };
        let decor = Decor {
            trace: self.trace.as_ref(),
            headroom: &self.headroom,
            cors: self.cors.as_ref(),
        };
        (writing, decor)
    }
}

/// What every reply of a request carries besides `x-request-id` (see `respond::reply_headers`).
pub struct Decor<'a> {
    pub trace: Option<&'a crate::ops::telemetry::Trace>,
    pub headroom: &'a Headroom,
    pub cors: Option<&'a http::HeaderValue>,
}

/// What it takes to send the request to a fallback model's pool instead: its routes, and the
/// client's body as read, to splice each fallback's upstream model name into.
pub struct Fallbacks {
    pub routes: Vec<Arc<Route>>,
    /// The client's request, to make each fallback's body from.
    pub sending: Sending,
}

/// The client's request as every route's body is made from it.
pub struct Sending {
    pub endpoint: crate::route::endpoint::Endpoint,
    pub body: Bytes,
    pub probe: crate::route::body::Probe,
    /// The output limit the reservation sends upstream, with its field.
    pub limit: Option<(u64, &'static str)>,
    /// The output events after which a stream is cut (the budget held).
    pub cut_at: Option<u64>,
}

/// `req_` + 16 hex of a per-process random prefix + 12 hex of a counter: unique, sortable
/// within a process, and cheap (no syscall per request).
pub fn next_request_id() -> String {
    static PREFIX: std::sync::OnceLock<[u8; 20]> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let mut p = *b"req_0000000000000000";
        crate::ops::telemetry::hex_into(&mut p[4..], &rand::random::<u64>().to_be_bytes());
        p
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Hex written directly: `format!` took 2,000 instructions a request (of some 150,000).
    let mut id = Vec::with_capacity(32);
    id.extend_from_slice(prefix);
    match n.to_be_bytes().split_at(2) {
        ([0, 0], low) => {
            id.resize(32, 0);
            crate::ops::telemetry::hex_into(&mut id[20..], low);
        }
        // Past 2^48 requests the counter takes more digits.
        _ => id.extend_from_slice(format!("{n:012x}").as_bytes()),
    }
    String::from_utf8(id).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_ids_are_req_and_28_hex_digits_each_new() {
        let (a, b) = (super::next_request_id(), super::next_request_id());
        assert_ne!(a, b);
        for id in [&a, &b] {
            let hex = id.strip_prefix("req_").expect("prefix");
            assert_eq!(hex.len(), 28, "{id}");
            assert!(
                hex.bytes()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            );
        }
        let n = |id: &str| u64::from_str_radix(&id[id.len() - 12..], 16).expect("hex");
        assert_eq!(n(&b), n(&a) + 1);
        assert_eq!(a[..20], b[..20]);
    }
}
