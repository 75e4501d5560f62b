//! TLS on the `main` and `direct` listeners (`[listeners.tls.main]`, `[listeners.tls.direct]`):
//! rustls through Pingora, HTTP/2 offered by ALPN beside HTTP/1.1.
//!
//! Each listener's certificate lives in a `ListenerCert`, the rustls certificate resolver of its
//! listener: every handshake takes the certificate in force from it, so a reload swaps it for
//! the handshakes that follow while connections already open keep theirs. `CertReloader`, a
//! background service, looks at both files' identity (mtime, length, inode) every second; on a
//! change it loads the pair, and only a pair that parses and whose key matches the certificate
//! replaces the one in force. Anything else (half-written files, a certificate renewed before
//! its key, a key of another certificate, a certificate already expired) is refused with a
//! warning and counted, the old pair stays, and the next change is tried again. Each
//! listener's certificate expiry is on `/metrics` for alerting.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora_core::listeners::tls::TlsSettings;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::{Fingerprint, fingerprint};
pub use crate::config::{Loaded, TlsFiles, load_tls as load};
use crate::ops::metrics::Metrics;

/// The identity of both files of a pair (a change to either is a renewal to try).
fn files_fingerprint(files: &TlsFiles) -> (Fingerprint, Fingerprint) {
    (fingerprint(&files.cert), fingerprint(&files.key))
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The certificate a listener presents, swapped whole on reload.
pub struct ListenerCert {
    listener: &'static str,
    files: TlsFiles,
    current: ArcSwap<CertifiedKey>,
    metrics: Arc<Metrics>,
}

impl fmt::Debug for ListenerCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerCert")
            .field("listener", &self.listener)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ListenerCert {
    /// Loads the pair now (a listener never starts without a usable certificate; an expired
    /// one is served, with a warning, since there is no other).
    pub fn new(
        listener: &'static str,
        files: TlsFiles,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<ListenerCert>, String> {
        let loaded = load(&files)?;
        if loaded.not_after < now_unix() {
            tracing::warn!(
                listener,
                "the TLS certificate {} has expired: clients will refuse it",
                files.cert.display()
            );
        }
        metrics.tls_expiry(listener, loaded.not_after);
        Ok(Arc::new(ListenerCert {
            listener,
            files,
            current: ArcSwap::new(loaded.key),
            metrics,
        }))
    }

    /// Pingora's TLS settings for this listener: this certificate, HTTP/2 and HTTP/1.1 by
    /// ALPN.
    pub fn settings(self: &Arc<Self>) -> TlsSettings {
        // intermediate() with empty paths makes no file access: the resolver is used instead.
        let mut settings = match TlsSettings::intermediate("", "") {
            Ok(s) => s,
            Err(e) => unreachable!("TlsSettings::intermediate does not fail: {e}"),
        };
        settings.set_cert_resolver(self.clone());
        settings.enable_h2();
        settings
    }

    /// Loads the files again; the pair in force changes only if the new one is usable and
    /// not expired.
    fn reload(&self) -> Result<(), String> {
        let new = load(&self.files)?;
        if new.not_after < now_unix() {
            return Err(format!("{} has expired", self.files.cert.display()));
        }
        self.current.store(new.key);
        self.metrics.tls_expiry(self.listener, new.not_after);
        Ok(())
    }
}

impl ResolvesServerCert for ListenerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Watches the listeners' certificate files and reloads them on change.
pub struct CertReloader {
    certs: Vec<Arc<ListenerCert>>,
}

impl CertReloader {
    pub fn new(certs: Vec<Arc<ListenerCert>>) -> CertReloader {
        CertReloader { certs }
    }
}

/// How often the files' identity is looked at.
const CHECK_EVERY: Duration = Duration::from_secs(1);

#[async_trait]
impl BackgroundService for CertReloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // What each listener's files were when last looked at (a refused version is not
        // retried until the files change again).
        let mut seen: Vec<_> = self
            .certs
            .iter()
            .map(|c| files_fingerprint(&c.files))
            .collect();
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            for (cert, seen) in self.certs.iter().zip(seen.iter_mut()) {
                let now = files_fingerprint(&cert.files);
                if now == *seen {
                    continue;
                }
                *seen = now;
                let result = cert.reload();
                match &result {
                    Ok(()) => tracing::info!(
                        listener = cert.listener,
                        "TLS certificate reloaded from {}",
                        cert.files.cert.display()
                    ),
                    Err(e) => tracing::warn!(
                        listener = cert.listener,
                        "TLS certificate not reloaded, the one in force stays: {e}"
                    ),
                }
                cert.metrics.tls_reload(cert.listener, result.is_ok());
            }
        }
    }
}
