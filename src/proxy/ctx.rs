//! Per-request state carried through the proxy phases: who is asking, where it goes, the body
//! that will be sent, and timings. One `Ctx` lives exactly as long as its request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;

use crate::config::keys::Key;
use crate::limit::rate::{Headroom, Slot};
use crate::meter::Meter;
use crate::route::endpoint::Endpoint;
use crate::route::{Route, Router};
pub use crate::state::Listener;

pub struct Ctx {
    pub request_id: String,
    pub started: Instant,
    /// Unix milliseconds at arrival: the record's `time`.
    pub time_ms: i64,
    pub listener: Listener,
    pub key: Option<Arc<Key>>,
    pub endpoint: Option<Endpoint>,
    /// The record's `endpoint` group name ("" until known).
    pub group: &'static str,
    /// The model the client asked for.
    pub model: String,
    /// The router snapshot this request was routed with.
    pub router: Option<Arc<Router>>,
    pub route: Option<Arc<Route>>,
    /// Index of the chosen upstream in the route's pool.
    pub upstream: usize,
    /// The whole body as it will be sent upstream.
    pub body: Bytes,
    pub stream: bool,
    pub status: u16,
    pub meter: Meter,
    /// Time to the first content byte sent to the client.
    pub ttft_ms: Option<u64>,
    /// The upstream was asked (so a per-request price applies on success).
    pub proxied: bool,
    /// The key's limits as of this request, for the `x-ratelimit-*` headers.
    pub headroom: Headroom,
    /// One of the key's `max_concurrent` slots, freed when the request ends.
    pub slot: Option<Slot>,
}

impl Ctx {
    pub fn new(listener: Listener) -> Ctx {
        Ctx {
            request_id: next_request_id(),
            started: Instant::now(),
            time_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            listener,
            key: None,
            endpoint: None,
            group: "",
            model: String::new(),
            router: None,
            route: None,
            upstream: 0,
            body: Bytes::new(),
            stream: false,
            status: 0,
            meter: Meter::None,
            ttft_ms: None,
            proxied: false,
            headroom: Headroom::default(),
            slot: None,
        }
    }
}

/// `req_` + 16 hex of a per-process random prefix + 12 hex of a counter: unique, sortable
/// within a process, and cheap (no syscall per request).
fn next_request_id() -> String {
    static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(rand::random::<u64>);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("req_{prefix:016x}{n:012x}")
}
