//! Traces. Every request carries a W3C trace context: the client's `traceparent` (and
//! `tracestate`) when it sent a valid one, else a new trace. Each upstream try is sent a
//! `traceparent` naming the try's own span, and every reply echoes the request's. With
//! `[telemetry] otlp_endpoint`, each request is exported over OTLP/HTTP (protobuf) as one
//! server span with child spans for auth, each upstream try and metering, built from the
//! times the request noted (no span objects live during the request).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use http::HeaderValue;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SpanData, SpanEvents, SpanExporter, SpanLinks, SpanProcessor,
};

/// `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Where spans go: an OTLP/HTTP collector (`/v1/traces` is added when missing).
    pub otlp_endpoint: String,
    pub service_name: String,
    /// Share of the traces the gateway starts that are exported (a client's `traceparent`
    /// decides for its own).
    pub sample_rate: f64,
}

/// A request's trace context and the times its spans are built from.
#[derive(Debug)]
pub struct Trace {
    pub trace_id: u128,
    /// The client's span, when it sent a `traceparent`.
    pub parent: Option<u64>,
    /// The request's own span.
    pub span_id: u64,
    pub sampled: bool,
    /// The client's `tracestate`, passed on as it came.
    pub state: Option<HeaderValue>,
    /// Set when the key was checked.
    pub auth_done: Option<Instant>,
    /// One per upstream try (recorded only when exporting).
    pub tries: Vec<TrySpan>,
}

#[derive(Debug)]
pub struct TrySpan {
    pub span_id: u64,
    pub start: Instant,
    pub end: Instant,
    pub pool: String,
    pub upstream: String,
    pub outcome: &'static str,
}

fn nonzero_u64() -> u64 {
    loop {
        let v = rand::random::<u64>();
        if v != 0 {
            return v;
        }
    }
}

impl Trace {
    /// From the request's headers: the client's trace when its `traceparent` is valid
    /// (version 00), else a new one.
    pub fn from_headers(headers: &http::HeaderMap) -> Trace {
        let parsed = headers
            .get("traceparent")
            .and_then(|v| parse_traceparent(v.as_bytes()));
        match parsed {
            Some((trace_id, parent, flags)) => Trace {
                trace_id,
                parent: Some(parent),
                span_id: nonzero_u64(),
                sampled: flags & 1 == 1,
                state: headers.get("tracestate").cloned(),
                auth_done: None,
                tries: Vec::new(),
            },
            None => Trace {
                trace_id: loop {
                    let v = rand::random::<u128>();
                    if v != 0 {
                        break v;
                    }
                },
                parent: None,
                span_id: nonzero_u64(),
                sampled: exporter().is_some_and(|e| rand::random::<f64>() < e.sample_rate),
                state: None,
                auth_done: None,
                tries: Vec::new(),
            },
        }
    }

    /// `traceparent` naming `span_id` (the request's span, or one try's).
    pub fn traceparent(&self, span_id: u64) -> String {
        // Its 55 bytes written directly, twice a request (the try's header and the reply's):
        // `write!` took 1,300 instructions each.
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        hex_into(&mut out[3..35], &self.trace_id.to_be_bytes());
        hex_into(&mut out[36..52], &span_id.to_be_bytes());
        hex_into(&mut out[53..], &[u8::from(self.sampled)]);
        String::from_utf8(out.to_vec()).unwrap_or_default()
    }

    /// A new span id for a try; its span is recorded by `tried` when exporting.
    pub fn next_try(&self) -> u64 {
        nonzero_u64()
    }

    pub fn recording(&self) -> bool {
        self.sampled && exporter().is_some()
    }
}

/// `bytes` in lowercase hex into `out` (two digits a byte, as many as `out` holds): the ids of
/// every request (`traceparent`, the request id) are written with it, `format!` being some
/// ten times slower.
pub fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
}

/// `00-<32 hex>-<16 hex>-<2 hex>`, neither id all zeros.
fn parse_traceparent(v: &[u8]) -> Option<(u128, u64, u8)> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let mut parts = s.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if version != "00"
        || parts.next().is_some()
        || !lower_hex(trace, 32)
        || !lower_hex(parent, 16)
        || !lower_hex(flags, 2)
    {
        return None;
    }
    let trace = u128::from_str_radix(trace, 16).ok().filter(|t| *t != 0)?;
    let parent = u64::from_str_radix(parent, 16).ok().filter(|p| *p != 0)?;
    Some((trace, parent, u8::from_str_radix(flags, 16).ok()?))
}

/// The exporter, once `start` set it up.
pub struct Exporter {
    processor: BatchSpanProcessor,
    sample_rate: f64,
    scope: InstrumentationScope,
    /// The processor's queue: spans past it are dropped (and counted) here.
    max_queue: u64,
}

impl Exporter {
    /// Hands one span to the batch processor, or drops it, counted, when its queue is full.
    /// `QUEUED` counts the spans handed over and not yet taken by the exporter, never fewer
    /// than the processor's queue holds, so a span let through always finds room there (the
    /// SDK would drop it unseen).
    fn submit(&self, span: SpanData) {
        // Acquire: a slot the exporter's taking freed (below, Release) is seen freed here.
        if QUEUED.fetch_add(1, Ordering::AcqRel) >= self.max_queue {
            QUEUED.fetch_sub(1, Ordering::Relaxed);
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.processor.on_end(span);
    }
}

/// The SDK's default queue (`OTEL_BSP_MAX_QUEUE_SIZE`).
const DEFAULT_MAX_QUEUE: usize = 2_048;

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

fn exporter() -> Option<&'static Exporter> {
    EXPORTER.get()
}

/// Sets up the OTLP exporter. Call before any runtime starts (its HTTP client is blocking,
/// on the batch processor's own thread).
pub fn start(cfg: &TelemetryConfig) -> Result<(), String> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let endpoint = if cfg
        .otlp_endpoint
        .trim_end_matches('/')
        .ends_with("/v1/traces")
    {
        cfg.otlp_endpoint.clone()
    } else {
        format!("{}/v1/traces", cfg.otlp_endpoint.trim_end_matches('/'))
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("OTLP exporter: {e}"))?;
    // The queue's size is read here and given to the processor, so the two agree (the other
    // `OTEL_BSP_*` variables are read by the SDK).
    let max_queue = std::env::var("OTEL_BSP_MAX_QUEUE_SIZE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_MAX_QUEUE);
    let config = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_max_queue_size(max_queue)
        .build();
    let mut processor = BatchSpanProcessor::builder(Watched::new(exporter))
        .with_batch_config(config)
        .build();
    processor.set_resource(
        &Resource::builder_empty()
            .with_service_name(cfg.service_name.clone())
            .build(),
    );
    let scope = InstrumentationScope::builder("modelgate")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    EXPORTER
        .set(Exporter {
            processor,
            sample_rate: cfg.sample_rate,
            scope,
            max_queue: max_queue as u64,
        })
        .map_err(|_| "telemetry started twice".to_string())
}

/// Spans the collector took, spans in batches it did not, and spans that found the queue full
/// (for `/metrics`).
static EXPORTED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Spans handed to the processor and not yet to the exporter (see `Exporter::submit`).
static QUEUED: AtomicU64 = AtomicU64::new(0);

/// Spans since the start, for `/metrics`.
pub struct ExportCounts {
    pub exported: u64,
    pub failed: u64,
    /// Found the export queue full.
    pub dropped: u64,
}

pub fn export_counts() -> ExportCounts {
    ExportCounts {
        exported: EXPORTED.load(Ordering::Relaxed),
        failed: FAILED.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
    }
}

/// How often a collector that keeps failing is said in the log.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// The OTLP exporter, with each batch's fate counted and a failing collector said in the log:
/// its first failure at once, then at most once a minute with the count since, and its
/// recovery (the SDK's own messages are not built in; without this a collector that is down
/// or refuses the spans went unnoticed).
#[derive(Debug)]
struct Watched<E> {
    inner: E,
    failing: Mutex<Failing>,
}

/// What the log has said about the collector's failures: at most one warning a minute (with
/// the count of failed batches since the last one) and one line when it answers again after a
/// warning, however the collector flaps.
#[derive(Debug, Default)]
struct Failing {
    /// Batches failed since the last warning.
    unsaid: u64,
    said_at: Option<Instant>,
    /// A warning was said since the last "works again".
    warned: bool,
}

impl Failing {
    /// A batch failed at `now`: the count of failed batches to warn of, if a warning is due.
    fn failed(&mut self, now: Instant) -> Option<u64> {
        self.unsaid += 1;
        if self
            .said_at
            .is_some_and(|t| now.saturating_duration_since(t) < FAILURE_LOG_EVERY)
        {
            return None;
        }
        self.said_at = Some(now);
        self.warned = true;
        Some(std::mem::take(&mut self.unsaid))
    }

    /// A batch went: whether to say the collector works again.
    fn succeeded(&mut self) -> bool {
        std::mem::take(&mut self.warned)
    }
}

impl<E> Watched<E> {
    fn new(inner: E) -> Self {
        Watched {
            inner,
            failing: Mutex::default(),
        }
    }

    fn note(&self, spans: u64, result: &OTelSdkResult) {
        let mut f = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => {
                EXPORTED.fetch_add(spans, Ordering::Relaxed);
                if f.succeeded() {
                    tracing::info!("OTLP export works again");
                }
            }
            Err(e) => {
                FAILED.fetch_add(spans, Ordering::Relaxed);
                if let Some(failed_batches) = f.failed(Instant::now()) {
                    tracing::warn!(
                        failed_batches,
                        "OTLP export failed ({e}); the spans of failed batches are dropped"
                    );
                }
            }
        }
    }
}

impl<E: SpanExporter> SpanExporter for Watched<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        // Out of the processor's queue (taken from it before this call).
        QUEUED.fetch_sub(spans, Ordering::Release);
        let result = self.inner.export(batch).await;
        self.note(spans, &result);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.inner.shutdown()
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Sends what is still queued (at shutdown).
pub fn flush() {
    if let Some(e) = exporter() {
        if let Err(err) = e.processor.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!("OTLP export at shutdown: {err}");
        }
    }
}

/// What the request span says about the request.
pub struct Finished<'a> {
    pub name: String,
    /// Arrival, on both clocks.
    pub started: Instant,
    pub started_at: SystemTime,
    pub status: u16,
    pub attributes: Vec<KeyValue>,
    /// When metering (the record) began and ended.
    pub metering: (Instant, Instant),
    pub metering_attributes: Vec<KeyValue>,
    pub trace: &'a Trace,
}

/// One span of a request's trace, before its context and times are made absolute.
struct Span {
    name: Cow<'static, str>,
    parent: u64,
    remote_parent: bool,
    kind: SpanKind,
    times: (Instant, Instant),
    attributes: Vec<KeyValue>,
    status: Status,
}

fn span_data(
    e: &Exporter,
    context: SpanContext,
    at: &dyn Fn(Instant) -> std::time::SystemTime,
    s: Span,
) -> SpanData {
    SpanData {
        span_context: context,
        parent_span_id: SpanId::from(s.parent),
        parent_span_is_remote: s.remote_parent,
        span_kind: s.kind,
        name: s.name,
        start_time: at(s.times.0),
        end_time: at(s.times.1),
        attributes: s.attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: s.status,
        instrumentation_scope: e.scope.clone(),
    }
}

/// Exports the request's spans, if it is sampled and an exporter is set up.
pub fn export(f: Finished) {
    let Some(e) = exporter() else { return };
    let t = f.trace;
    if !t.sampled {
        return;
    }
    let at = |i: Instant| f.started_at + i.saturating_duration_since(f.started);
    let state = t
        .state
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let context = |span: u64| {
        SpanContext::new(
            TraceId::from(t.trace_id),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            false,
            state.clone(),
        )
    };
    let span = |name: Cow<'static, str>,
                id: u64,
                parent: u64,
                remote_parent: bool,
                kind: SpanKind,
                times: (Instant, Instant),
                attributes: Vec<KeyValue>,
                status: Status| {
        let s = Span {
            name,
            parent,
            remote_parent,
            kind,
            times,
            attributes,
            status,
        };
        span_data(e, context(id), &at, s)
    };
    let end = f.metering.1;
    let error = |failed: bool, what: &str| {
        if failed {
            Status::error(what.to_string())
        } else {
            Status::Unset
        }
    };
    e.submit(span(
        f.name.into(),
        t.span_id,
        t.parent.unwrap_or(0),
        t.parent.is_some(),
        SpanKind::Server,
        (f.started, end),
        f.attributes,
        error(f.status >= 500, "server error"),
    ));
    if let Some(done) = t.auth_done {
        e.submit(span(
            "auth".into(),
            nonzero_u64(),
            t.span_id,
            false,
            SpanKind::Internal,
            (f.started, done),
            Vec::new(),
            Status::Unset,
        ));
    }
    for (n, try_) in t.tries.iter().enumerate() {
        let failed = !matches!(try_.outcome, "2xx" | "4xx");
        e.submit(span(
            "upstream".into(),
            try_.span_id,
            t.span_id,
            false,
            SpanKind::Client,
            (try_.start, try_.end),
            vec![
                KeyValue::new("modelgate.pool", try_.pool.clone()),
                KeyValue::new("server.address", try_.upstream.clone()),
                KeyValue::new("modelgate.attempt", n as i64 + 1),
                KeyValue::new("modelgate.outcome", try_.outcome),
            ],
            error(failed, try_.outcome),
        ));
    }
    e.submit(span(
        "metering".into(),
        nonzero_u64(),
        t.span_id,
        false,
        SpanKind::Internal,
        f.metering,
        f.metering_attributes,
        Status::Unset,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A collector that flaps is said at most once a minute, with the count of batches failed
    /// since, and "works again" only after a warning.
    #[test]
    fn failures_are_said_at_most_once_a_minute_however_the_collector_flaps() {
        let t0 = Instant::now();
        let mut f = super::Failing::default();
        assert_eq!(f.failed(t0), Some(1));
        assert!(f.succeeded());
        assert!(!f.succeeded());
        for s in 1..=5 {
            assert_eq!(f.failed(t0 + Duration::from_secs(s)), None);
            assert!(!f.succeeded());
        }
        assert_eq!(f.failed(t0 + Duration::from_secs(61)), Some(6));
        assert!(f.succeeded());
    }

    #[test]
    fn traceparent_is_parsed_strictly_and_written_back() {
        let v = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (trace, parent, flags) = parse_traceparent(v).expect("valid");
        assert_eq!(trace, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!((parent, flags), (0x00f067aa0ba902b7, 1));
        for bad in [
            &b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"[..],
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"garbage",
        ] {
            assert_eq!(
                parse_traceparent(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let t = Trace::from_headers(&headers);
        assert_eq!(t.parent, Some(0x00f067aa0ba902b7));
        let tp = t.traceparent(0xabc);
        assert_eq!(
            tp,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000abc-01"
        );
        let fresh = Trace::from_headers(&http::HeaderMap::new());
        assert_ne!(fresh.trace_id, 0);
        assert_eq!(fresh.parent, None);
    }
}
