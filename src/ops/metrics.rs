//! Prometheus metrics for the admin listener's `/metrics`. Requests are counted and timed as
//! they end (`request_end`), upstream tries as they end (`attempt`); the store's figures, the
//! upstreams' health and the process's are read at scrape time. Labels stay bounded: models
//! and pools are the configured ones, a client address is a label only for the first
//! `MAX_CLIENTS` that failed authentication, a key id only where `[metrics] key_label = true`.
//! One `Metrics` is made at start and handed (an `Arc`) to each part that counts; none is global.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus::{
    CounterVec, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Client addresses given a label of their own on `auth_failures_total`; later ones count
/// under `client="other"`.
const MAX_CLIENTS: usize = 1000;

/// Seconds, for request, upstream and first-token times.
const SLOW_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Seconds, for the gateway's own share of a request and for store batches.
const FAST_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// What one request was, as it ended.
pub struct RequestEnd<'a> {
    pub listener: &'static str,
    pub endpoint: &'static str,
    /// The configured model that routed it ("" when none did: a refusal, an unknown model).
    pub model: &'a str,
    pub status: u16,
    /// The code of the gateway's own refusal (`invalid_api_key`, `rpm`, …), if it refused.
    pub refusal: Option<&'static str>,
    pub total: Duration,
    /// The pool and the time spent on its upstream tries and the reply (None: never sent
    /// upstream).
    pub upstream: Option<(&'a str, Duration)>,
    /// Backoff waits between tries.
    pub waited: Duration,
    pub ttft: Option<Duration>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost: f64,
    pub key: Option<&'a str>,
}

pub struct Metrics {
    registry: Registry,
    /// `process_*`, unprefixed as Prometheus names them.
    process: Registry,
    requests: IntCounterVec,
    refusals: IntCounterVec,
    request_seconds: HistogramVec,
    overhead_seconds: Histogram,
    upstream_seconds: HistogramVec,
    ttft_seconds: HistogramVec,
    tokens: IntCounterVec,
    cost: CounterVec,
    attempts: IntCounterVec,
    retries: IntCounterVec,
    upstream_healthy: IntGaugeVec,
    upstream_in_flight: IntGaugeVec,
    auth_failures: IntCounterVec,
    sign_ins: IntCounterVec,
    auth_clients: Mutex<HashSet<IpAddr>>,
    key_requests: IntCounterVec,
    key_tokens: IntCounterVec,
    key_cost: CounterVec,
    key_label: AtomicBool,
    pub keys_reloads: IntCounter,
    /// 1 while the shared limits' Redis answers (0 when it does not, absent without Redis).
    redis_up: IntGauge,
    /// Times Redis stopped answering.
    redis_down_total: IntCounter,
    /// Requests whose limits were decided without Redis (`on_redis_down`).
    pub limits_fallback: IntCounter,
    /// Upstream connections opened (a request found no idle one to reuse).
    pub upstream_connects: IntCounter,
    /// Reused upstream connections found closed by the upstream as a request went on them
    /// (the request went again on a new one).
    pub upstream_stale: IntCounter,
    /// Keys-file reloads refused because the file did not parse or validate.
    pub keys_reload_errors: IntCounter,
    pub config_reloads: IntCounter,
    /// Listener certificate reloads, by listener and result (`ok`, `rejected`).
    tls_reloads: IntCounterVec,
    /// When each TLS listener's certificate expires (Unix seconds).
    tls_expiry: IntGaugeVec,
    /// Config-file reloads refused (the pools and models in force stay).
    pub config_reload_errors: IntCounter,
    pub keys: IntGauge,
    records_written: IntCounter,
    otlp_spans_exported: IntCounter,
    otlp_spans_failed: IntCounter,
    otlp_spans_dropped: IntCounter,
    records_overflowed: IntCounter,
    records_dropped: IntCounter,
    record_write_errors: IntCounter,
    journal_failures: IntCounter,
    records_queued: IntGauge,
    spool_bytes: IntGauge,
    records_held: IntGauge,
    store_full: IntGauge,
    store_refused: IntCounter,
    access_log_dropped: IntCounter,
    batch_rows: Histogram,
    batch_seconds: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// The gateway's metrics, made once at start and handed to every part that counts.
    // A table: one entry a metric.
    #[allow(clippy::too_many_lines)]
    pub fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new_custom(Some("modelgate".into()), None)?;
        let process = Registry::new();
        #[cfg(target_os = "linux")]
        process.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let reg = |c: Box<dyn prometheus::core::Collector>| registry.register(c);
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::with_opts(Opts::new(name, help))?;
            reg(Box::new(c.clone()))?;
            Ok(c)
        };
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::with_opts(Opts::new(name, help))?;
            reg(Box::new(g.clone()))?;
            Ok(g)
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            reg(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let sums = |name: &str, help: &str, labels: &[&str]| {
            let c = CounterVec::new(Opts::new(name, help), labels)?;
            reg(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
            reg(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let histograms = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            let h = HistogramVec::new(opts, labels)?;
            reg(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
            reg(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        Ok(Metrics {
            requests: counters(
                "requests_total",
                "Requests by listener, endpoint group, routed model and status",
                &["listener", "endpoint", "model", "status"],
            )?,
            refusals: counters(
                "refusals_total",
                "Requests the gateway refused itself, by status and reason (the error code; \
                 for 429 the limit: rpm, tpm, concurrency, auth_failures)",
                &["status", "reason"],
            )?,
            request_seconds: histograms(
                "request_duration_seconds",
                "Whole requests, arrival to the last byte of the reply",
                &SLOW_BUCKETS,
                &["endpoint"],
            )?,
            overhead_seconds: histogram(
                "gateway_overhead_seconds",
                "The gateway's own share of proxied requests: total minus upstream time and \
                 backoff waits",
                FAST_BUCKETS.to_vec(),
            )?,
            upstream_seconds: histograms(
                "upstream_duration_seconds",
                "Time on the upstream: tries and the reply streamed through",
                &SLOW_BUCKETS,
                &["pool"],
            )?,
            ttft_seconds: histograms(
                "time_to_first_token_seconds",
                "Arrival to the first content byte sent to the client",
                &SLOW_BUCKETS,
                &["model"],
            )?,
            tokens: counters(
                "tokens_total",
                "Metered tokens by model and kind (prompt, completion)",
                &["model", "kind"],
            )?,
            cost: sums("cost_total", "Credits spent, by model", &["model"])?,
            attempts: counters(
                "upstream_attempts_total",
                "Tries sent upstream, by pool, upstream and outcome (2xx, 4xx, 429, 5xx, \
                 error, timeout)",
                &["pool", "upstream", "outcome"],
            )?,
            retries: counters(
                "upstream_retries_total",
                "Tries after a request's first, by pool and upstream",
                &["pool", "upstream"],
            )?,
            upstream_healthy: gauges(
                "upstream_healthy",
                "1 while the upstream is in rotation",
                &["pool", "upstream"],
            )?,
            upstream_in_flight: gauges(
                "upstream_in_flight",
                "Requests on the upstream now",
                &["pool", "upstream"],
            )?,
            auth_failures: counters(
                "auth_failures_total",
                "Wrong keys presented, by client address (the first 1000 addresses; then \
                 'other')",
                &["client"],
            )?,
            sign_ins: counters(
                "console_sign_ins_total",
                "Console sign-ins by result: ok, failed (wrong user or password), throttled \
                 (its address past its limit), held (too many failures from all addresses: \
                 429 before its password was checked)",
                &["result"],
            )?,
            auth_clients: Mutex::new(HashSet::new()),
            key_requests: counters(
                "key_requests_total",
                "Requests by key id ([metrics] key_label = true only)",
                &["key"],
            )?,
            key_tokens: counters(
                "key_tokens_total",
                "Metered tokens by key id ([metrics] key_label = true only)",
                &["key"],
            )?,
            key_cost: sums(
                "key_cost_total",
                "Credits by key id ([metrics] key_label = true only)",
                &["key"],
            )?,
            key_label: AtomicBool::new(false),
            keys_reloads: counter("keys_reloads_total", "Keys-file reloads applied")?,
            redis_up: gauge("redis_up", "1 while the shared limits' Redis answers")?,
            redis_down_total: counter(
                "redis_down_total",
                "Times the shared limits' Redis stopped answering",
            )?,
            limits_fallback: counter(
                "limits_fallback_total",
                "Requests whose limits were decided without Redis (on_redis_down)",
            )?,
            upstream_connects: counter(
                "upstream_connections_opened_total",
                "Upstream connections opened (no idle one could be reused)",
            )?,
            upstream_stale: counter(
                "upstream_connections_stale_total",
                "Reused upstream connections the upstream had closed; the request went on a new one",
            )?,
            keys_reload_errors: counter(
                "keys_reload_errors_total",
                "Keys-file reloads rejected (the previous keys stay in force)",
            )?,
            tls_reloads: counters(
                "tls_certificate_reloads_total",
                "Listener certificate reloads by listener and result: ok, or rejected (the \
                 certificate in force stays)",
                &["listener", "result"],
            )?,
            tls_expiry: gauges(
                "tls_certificate_expiry_timestamp_seconds",
                "When the certificate each TLS listener presents expires (Unix seconds)",
                &["listener"],
            )?,
            config_reloads: counter(
                "config_reloads_total",
                "Config-file reloads applied (pools, models, prices, fallbacks)",
            )?,
            config_reload_errors: counter(
                "config_reload_errors_total",
                "Config-file reloads rejected (the pools and models in force stay)",
            )?,
            keys: gauge("keys", "Keys in force")?,
            records_written: counter(
                "usage_records_written_total",
                "Usage records committed to the store",
            )?,
            otlp_spans_exported: counter(
                "otlp_spans_exported_total",
                "Spans the OTLP collector took",
            )?,
            otlp_spans_failed: counter(
                "otlp_spans_failed_total",
                "Spans dropped because their batch's export to the OTLP collector failed",
            )?,
            otlp_spans_dropped: counter(
                "otlp_spans_dropped_total",
                "Spans dropped because the export queue was full (OTEL_BSP_MAX_QUEUE_SIZE)",
            )?,
            records_overflowed: counter(
                "usage_records_overflowed_total",
                "Usage records that found the writer's channel full and waited in the overflow queue",
            )?,
            records_dropped: counter(
                "usage_records_dropped_total",
                "Usage records dropped: more waited in memory than its bound (on_store_full = \"serve\"), or the store was closed",
            )?,
            record_write_errors: counter("usage_record_write_errors_total", "Failed store writes")?,
            journal_failures: counter(
                "usage_journal_failures_total",
                "Journal lines (a request's entry or record) that could not be written",
            )?,
            records_queued: gauge(
                "usage_records_queued",
                "Usage records waiting to be written",
            )?,
            spool_bytes: gauge(
                "usage_spool_bytes",
                "Bytes of usage records waiting on disk for the database to come back",
            )?,
            records_held: gauge(
                "usage_records_held",
                "Usage records waiting in memory because neither the database nor the spool takes them (a full disk)",
            )?,
            store_full: gauge(
                "usage_store_full",
                "1 while as many usage records wait in memory as [storage] memory_max_records",
            )?,
            store_refused: counter(
                "usage_store_refused_total",
                "Requests refused with 503 usage_store_unavailable while the usage store was full",
            )?,
            access_log_dropped: counter(
                "access_log_lines_dropped_total",
                "Access-log lines dropped because the output could not keep up",
            )?,
            batch_rows: histogram(
                "usage_batch_rows",
                "Records per store commit",
                vec![
                    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0,
                ],
            )?,
            batch_seconds: histogram(
                "usage_batch_duration_seconds",
                "Time to commit one batch of records",
                FAST_BUCKETS.to_vec(),
            )?,
            registry,
            process,
        })
    }

    /// `[metrics] key_label`: per-key series on or off.
    pub fn set_key_label(&self, on: bool) {
        self.key_label.store(on, Ordering::Relaxed);
    }

    /// Counts and times one request that ended.
    pub fn request_end(&self, r: &RequestEnd) {
        let status = status_label(r.status);
        let status = status.as_ref();
        let endpoint = if r.endpoint.is_empty() {
            "none"
        } else {
            r.endpoint
        };
        self.requests
            .with_label_values(&[r.listener, endpoint, r.model, status])
            .inc();
        if let Some(reason) = r.refusal {
            self.refusals.with_label_values(&[status, reason]).inc();
        }
        self.request_seconds
            .with_label_values(&[endpoint])
            .observe(r.total.as_secs_f64());
        if let Some((pool, up)) = r.upstream {
            let own = r.total.saturating_sub(up).saturating_sub(r.waited);
            self.overhead_seconds.observe(own.as_secs_f64());
            self.upstream_seconds
                .with_label_values(&[pool])
                .observe(up.as_secs_f64());
        }
        if let Some(t) = r.ttft {
            self.ttft_seconds
                .with_label_values(&[r.model])
                .observe(t.as_secs_f64());
        }
        if r.prompt_tokens > 0 {
            self.tokens
                .with_label_values(&[r.model, "prompt"])
                .inc_by(r.prompt_tokens);
        }
        if r.completion_tokens > 0 {
            self.tokens
                .with_label_values(&[r.model, "completion"])
                .inc_by(r.completion_tokens);
        }
        if r.cost > 0.0 {
            self.cost.with_label_values(&[r.model]).inc_by(r.cost);
        }
        if let (Some(key), true) = (r.key, self.key_label.load(Ordering::Relaxed)) {
            self.key_requests.with_label_values(&[key]).inc();
            let tokens = r.prompt_tokens.saturating_add(r.completion_tokens);
            if tokens > 0 {
                self.key_tokens.with_label_values(&[key]).inc_by(tokens);
            }
            if r.cost > 0.0 {
                self.key_cost.with_label_values(&[key]).inc_by(r.cost);
            }
        }
    }

    /// One try sent upstream and how it ended; `retry`: not the request's first.
    pub fn attempt(&self, pool: &str, upstream: &str, outcome: &str, retry: bool) {
        self.attempts
            .with_label_values(&[pool, upstream, outcome])
            .inc();
        if retry {
            self.retries.with_label_values(&[pool, upstream]).inc();
        }
    }

    /// A request Pingora could not parse, answered on `listener` with the contract's 400: a
    /// request like any other (endpoint `none`, no model) and a refusal.
    pub fn unparseable(&self, listener: &str) {
        self.requests
            .with_label_values(&[listener, "none", "", "400"])
            .inc();
        self.refusals
            .with_label_values(&["400", "unparseable"])
            .inc();
    }

    /// A wrong key from `client`.
    pub fn auth_failure(&self, client: Option<IpAddr>) {
        let label = match client {
            Some(ip) => {
                let mut seen = self.auth_clients.lock().unwrap_or_else(|e| e.into_inner());
                if seen.contains(&ip) || seen.len() < MAX_CLIENTS {
                    seen.insert(ip);
                    ip.to_string()
                } else {
                    "other".to_string()
                }
            }
            None => "unknown".to_string(),
        };
        self.auth_failures.with_label_values(&[&label]).inc();
    }

    /// A console sign-in: `ok`, `failed`, `throttled` or `held`.
    pub fn sign_in(&self, result: &str) {
        self.sign_ins.with_label_values(&[result]).inc();
    }

    /// A listener's certificate files changed and were loaded (`ok`) or refused.
    pub fn tls_reload(&self, listener: &str, ok: bool) {
        let result = if ok { "ok" } else { "rejected" };
        self.tls_reloads
            .with_label_values(&[listener, result])
            .inc();
    }

    pub fn tls_expiry(&self, listener: &str, not_after: i64) {
        self.tls_expiry
            .with_label_values(&[listener])
            .set(not_after);
    }

    pub fn redis_down(&self) {
        self.redis_up.set(0);
        self.redis_down_total.inc();
    }

    pub fn redis_up(&self) {
        self.redis_up.set(1);
    }

    /// One commit of the usage writer.
    pub fn batch(&self, rows: usize, took: Duration) {
        self.batch_rows.observe(rows as f64);
        self.batch_seconds.observe(took.as_secs_f64());
    }

    /// The access log's dropped lines so far (read at each scrape).
    pub fn access_log_dropped(&self, total: u64) {
        self.access_log_dropped
            .inc_by(total.saturating_sub(self.access_log_dropped.get()));
    }

    /// The Prometheus text exposition, with the store's, the upstreams' and the process's
    /// figures as of now.
    pub fn render(&self, store: StoreStats, upstreams: &[UpstreamGauge<'_>]) -> String {
        let bump = |c: &IntCounter, now: u64| c.inc_by(now.saturating_sub(c.get()));
        bump(&self.records_written, store.written);
        let spans = crate::ops::telemetry::export_counts();
        bump(&self.otlp_spans_exported, spans.exported);
        bump(&self.otlp_spans_failed, spans.failed);
        bump(&self.otlp_spans_dropped, spans.dropped);
        bump(&self.records_overflowed, store.overflowed);
        bump(&self.records_dropped, store.dropped);
        bump(&self.record_write_errors, store.write_errors);
        bump(&self.journal_failures, store.journal_failures);
        self.records_queued.set(store.queued as i64);
        self.spool_bytes
            .set(i64::try_from(store.spool_bytes).unwrap_or(i64::MAX));
        self.records_held
            .set(i64::try_from(store.held).unwrap_or(i64::MAX));
        self.store_full.set(i64::from(store.full));
        bump(&self.store_refused, store.refused);
        // Pools come and go with reloads: show only the ones in force.
        self.upstream_healthy.reset();
        self.upstream_in_flight.reset();
        for up in upstreams {
            let labels = [up.pool, up.url];
            self.upstream_healthy
                .with_label_values(&labels)
                .set(i64::from(up.healthy));
            self.upstream_in_flight
                .with_label_values(&labels)
                .set(i64::try_from(up.in_flight).unwrap_or(i64::MAX));
        }
        let mut families = self.registry.gather();
        let mut process = self.process.gather();
        precise_cpu(&mut process, cpu_seconds());
        families.extend(process);
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&families, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The usage store's figures as it reports them (`store::Store::stats`), read at each scrape
/// and at exit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Rows committed.
    pub written: u64,
    /// Records that found the channel full and went to the overflow queue (not lost).
    pub overflowed: u64,
    /// Records lost because the overflow queue was full or the store was closed.
    pub dropped: u64,
    /// Records accepted but not yet committed (channel, overflow queue, current batch).
    pub queued: u64,
    /// Rows lost because their batch failed to commit twice.
    pub write_errors: u64,
    /// Bytes of records waiting in the spool for the database to come back.
    pub spool_bytes: u64,
    /// Records this process put in the spool and has not written from it yet.
    pub spooled: u64,
    /// Records waiting in memory because neither the database nor the spool takes them.
    pub held: u64,
    /// Past its bound of records waiting in memory (`Store::full`).
    pub full: bool,
    /// Requests refused with 503 `usage_store_unavailable` while the store was full.
    pub refused: u64,
    /// Journal lines that could not be written (a full or failing disk).
    pub journal_failures: u64,
}

/// An upstream of a pool in force, as the router reports it at a scrape
/// (`route::Router::upstream_gauges`).
pub struct UpstreamGauge<'a> {
    pub pool: &'a str,
    pub url: &'a str,
    pub healthy: bool,
    pub in_flight: usize,
}

/// `process_cpu_seconds_total` to the clock tick: the prometheus crate's process collector
/// rounds it down to whole seconds, so a gateway at a few percent of a core read 0 for
/// minutes, then jumped (a rate over it was steps).
fn precise_cpu(families: &mut [prometheus::proto::MetricFamily], seconds: Option<f64>) {
    let Some(seconds) = seconds else { return };
    for family in families
        .iter_mut()
        .filter(|f| f.name() == "process_cpu_seconds_total")
    {
        for m in family.mut_metric() {
            let mut c = prometheus::proto::Counter::default();
            c.set_value(seconds);
            m.set_counter(c);
        }
    }
}

/// User and system CPU time of this process, in seconds, from `/proc/self/stat`.
fn cpu_seconds() -> Option<f64> {
    cpu_seconds_of(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// From a `/proc/PID/stat` line: utime and stime are its 14th and 15th fields, in clock ticks
/// of 1/100 s (Linux's USER_HZ). The command name (2nd) may hold spaces, so fields are counted
/// from its closing parenthesis.
fn cpu_seconds_of(stat: &str) -> Option<f64> {
    let mut after = stat.rsplit_once(')')?.1.split_whitespace();
    let utime: u64 = after.nth(11)?.parse().ok()?;
    let stime: u64 = after.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// Status codes as label values, without allocating for the common ones.
fn status_label(status: u16) -> std::borrow::Cow<'static, str> {
    let common = match status {
        200 => "200",
        201 => "201",
        204 => "204",
        400 => "400",
        401 => "401",
        402 => "402",
        403 => "403",
        404 => "404",
        405 => "405",
        408 => "408",
        413 => "413",
        429 => "429",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        other => return other.to_string().into(),
    };
    common.into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_seconds_are_read_to_the_tick() {
        let stat = "4242 (model (gate)) S 1 4242 4242 0 -1 4194560 1234 0 0 0 123 45 0 0 20 0 3 0";
        assert_eq!(super::cpu_seconds_of(stat), Some(1.68));
        assert_eq!(super::cpu_seconds_of("4242 (x) S 1"), None);
    }
}
