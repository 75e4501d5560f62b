//! The shutdown's last step, a background service: once Pingora has stopped accepting, wait
//! for the requests in flight (`ops::lifecycle`), cut those left after the grace period, write
//! every usage record and access-log line, and exit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::ops::lifecycle::{CUT_WAIT, Lifecycle};
use crate::store::Store;

/// The background service that ends the process once a graceful shutdown has drained.
pub struct Drain {
    pub lifecycle: Arc<Lifecycle>,
    pub store: Arc<Store>,
    pub grace: Duration,
    /// Its pending lines are written before the exit.
    pub access_log: Option<crate::ops::access_log::AccessLog>,
}

#[async_trait]
impl BackgroundService for Drain {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        let started = Instant::now();
        tracing::info!(
            in_flight = self.lifecycle.inflight(),
            "shutting down: no new connections; waiting for requests in flight"
        );
        if !self.lifecycle.settle(self.grace).await {
            tracing::warn!(
                in_flight = self.lifecycle.inflight(),
                "grace period over: ending the requests still in flight"
            );
            self.lifecycle.cut();
            if !self.lifecycle.settle(CUT_WAIT).await {
                tracing::error!(
                    in_flight = self.lifecycle.inflight(),
                    "requests did not end when asked; their records may be missing"
                );
            }
        }
        let store = self.store.clone();
        let access_log = self.access_log.clone();
        let _ = tokio::task::spawn_blocking(move || {
            store.close();
            crate::ops::telemetry::flush();
            if let Some(log) = access_log {
                log.flush();
            }
        })
        .await;
        let stats = self.store.stats();
        // Records that never reached the database or the spool, said as such: dropped past the
        // overflow bound, or in batches that failed to commit (the journal keeps those it
        // could write, for the next start).
        let lost = stats.dropped + stats.write_errors;
        if lost > 0 {
            tracing::error!(
                written = stats.written,
                spooled = stats.spooled,
                spooled_bytes = stats.spool_bytes,
                not_written = lost,
                dropped = stats.dropped,
                failed = stats.write_errors,
                after_ms = started.elapsed().as_millis() as u64,
                "usage records: {lost} not written (the journal keeps those it could write for \
                 the next start); exiting"
            );
        } else if stats.spool_bytes > 0 {
            tracing::warn!(
                written = stats.written,
                spooled = stats.spooled,
                spooled_bytes = stats.spool_bytes,
                after_ms = started.elapsed().as_millis() as u64,
                "usage records written or spooled (the spooled ones are written at the next \
                 start); exiting"
            );
        } else {
            tracing::info!(
                written = stats.written,
                after_ms = started.elapsed().as_millis() as u64,
                "usage records written; exiting"
            );
        }
        std::process::exit(0);
    }
}
