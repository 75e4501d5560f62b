//! Prometheus metrics for the admin listener's `/metrics`. Request counters are bumped as
//! requests end; the store's figures are read from it at scrape time.

use std::sync::OnceLock;

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

use crate::store::StoreStats;

pub struct Metrics {
    registry: Registry,
    /// Requests that passed auth, by listener, endpoint group and status.
    pub requests: IntCounterVec,
    /// Keys-file reloads refused because the file did not parse or validate.
    pub keys_reload_errors: IntCounter,
    /// Config-file reloads refused (the pools and models in force stay).
    pub config_reload_errors: IntCounter,
    pub keys: IntGauge,
    records_written: IntCounter,
    records_overflowed: IntCounter,
    records_dropped: IntCounter,
    record_write_errors: IntCounter,
    records_queued: IntGauge,
}

impl Metrics {
    fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new_custom(Some("modelgate".into()), None)?;
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let requests = IntCounterVec::new(
            Opts::new(
                "requests_total",
                "Requests that passed auth, by listener, endpoint group and status",
            ),
            &["listener", "endpoint", "status"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        Ok(Metrics {
            requests,
            keys_reload_errors: counter(
                "keys_reload_errors_total",
                "Keys-file reloads rejected (the previous keys stay in force)",
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
            records_overflowed: counter(
                "usage_records_overflowed_total",
                "Usage records that found the writer's channel full and waited in the overflow queue",
            )?,
            records_dropped: counter(
                "usage_records_dropped_total",
                "Usage records dropped because the overflow queue was full too",
            )?,
            record_write_errors: counter("usage_record_write_errors_total", "Failed store writes")?,
            records_queued: gauge(
                "usage_records_queued",
                "Usage records waiting to be written",
            )?,
            registry,
        })
    }

    /// The Prometheus text exposition, with the store's figures as of now.
    pub fn render(&self, store: StoreStats) -> String {
        let bump = |c: &IntCounter, now: u64| c.inc_by(now.saturating_sub(c.get()));
        bump(&self.records_written, store.written);
        bump(&self.records_overflowed, store.overflowed);
        bump(&self.records_dropped, store.dropped);
        bump(&self.record_write_errors, store.write_errors);
        self.records_queued.set(store.queued as i64);
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The process's metrics; None only if the registry could not be built (then nothing is counted).
pub fn get() -> Option<&'static Metrics> {
    static METRICS: OnceLock<Option<Metrics>> = OnceLock::new();
    METRICS.get_or_init(|| Metrics::new().ok()).as_ref()
}
