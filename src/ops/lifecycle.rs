//! Shutdown that loses nothing. Every API request holds an `InFlight` guard for its whole life
//! (its usage record is handed to the store before the guard drops). On SIGTERM (or after an
//! upgrade's hand-over) Pingora stops accepting; the `Drain` service then waits until nothing
//! is in flight, or until `grace_period_seconds` have passed and it asks the rest to end
//! (`cut`): a stream stops without its final chunk, a request still waiting for its upstream
//! gets 503 `shutting_down`, and each writes its record. Then the store is flushed and the
//! process exits 0, as soon as that is done rather than after the whole grace period.
//!
//! SIGINT (Ctrl-C) shuts down the same way (`Signals`); a second one ends the grace period at
//! once, so the requests in flight are cut then, each still with its record.
//!
//! From SIGTERM or SIGINT on, the gateway is draining: `/readyz` answers 503 and HTTP/1
//! replies close their connections. With `[server] shutdown_delay_ms`, it keeps accepting and
//! serving for that long first, so a load balancer sees it leave rotation before its listeners
//! close; another SIGTERM ends the delay, a Ctrl-C ends it and cuts the requests in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::sync::watch;

/// How long requests that were told to end get to write their records.
pub const CUT_WAIT: Duration = Duration::from_secs(3);

pub struct Lifecycle {
    inflight: AtomicUsize,
    cut: watch::Sender<bool>,
    draining: AtomicBool,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            inflight: AtomicUsize::new(0),
            cut: watch::Sender::new(false),
            draining: AtomicBool::new(false),
        }
    }
}

impl Lifecycle {
    /// A request starts; it is in flight until the guard drops.
    pub fn enter(self: &Arc<Self>) -> InFlight {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    /// A shutdown has begun: the instance is leaving rotation.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Asks every request in flight to end now.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Resolves once `cut` has been called.
    pub async fn cut_requested(&self) {
        let mut rx = self.cut.subscribe();
        let _ = rx.wait_for(|&cut| cut).await;
    }

    /// Waits until nothing is in flight or `limit` has passed; true if nothing is.
    pub async fn settle(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while self.inflight() > 0 {
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

pub struct InFlight(Arc<Lifecycle>);

impl InFlight {
    pub fn lifecycle(&self) -> Arc<Lifecycle> {
        self.0.clone()
    }

    /// The lifecycle, borrowed (for a wait on `cut` within a borrow of the request).
    pub fn get(&self) -> &Lifecycle {
        &self.0
    }
}

/// Resolves when the shutdown asks requests to end (never without a lifecycle).
pub async fn cut(life: Option<&Lifecycle>) {
    match life {
        Some(l) => l.cut_requested().await,
        None => std::future::pending().await,
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The signals that end the process: SIGTERM and SIGINT shut down gracefully, SIGQUIT hands
/// the listeners over to a new instance (Pingora's upgrade). Pingora's own watch takes SIGINT
/// for a fast shutdown, which stops the runtimes at once: every request in flight lost its
/// record. Here a SIGINT after any of them asks the requests in flight to end now (`cut`).
pub struct Signals {
    lifecycle: Arc<Lifecycle>,
    /// `[server] shutdown_delay_ms`: how long SIGTERM or SIGINT keeps the listeners open,
    /// draining, before the shutdown proper.
    delay: Duration,
    /// SIGQUIT, SIGTERM, SIGINT seen before Pingora watches for them (`recv`): its watch
    /// starts once the listeners are open, and a signal in between must neither kill the
    /// process (their default) nor be lost.
    early: [Arc<std::sync::atomic::AtomicBool>; 3],
}

impl Signals {
    /// Catches the shutdown signals from now on (call it before the listeners open).
    pub fn new(lifecycle: Arc<Lifecycle>, delay: Duration) -> Signals {
        use signal_hook::consts::{SIGINT, SIGQUIT, SIGTERM};
        let early: [Arc<std::sync::atomic::AtomicBool>; 3] = Default::default();
        for (sig, flag) in [SIGQUIT, SIGTERM, SIGINT].into_iter().zip(&early) {
            if let Err(e) = signal_hook::flag::register(sig, flag.clone()) {
                tracing::warn!("cannot catch signal {sig} before the server runs: {e}");
            }
        }
        Signals {
            lifecycle,
            delay,
            early,
        }
    }

    /// The shutdown a signal caught before `recv` began asks for, if one was.
    fn caught_early(&self) -> Option<ShutdownSignal> {
        let [quit, term, int] = &self.early;
        let seen = |f: &Arc<std::sync::atomic::AtomicBool>| f.swap(false, Ordering::SeqCst);
        if seen(quit) {
            Some(ShutdownSignal::GracefulUpgrade)
        } else if seen(term) || seen(int) {
            Some(ShutdownSignal::GracefulTerminate)
        } else {
            None
        }
    }
}

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut quit), Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::quit()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot watch the shutdown signals; stop the process with SIGKILL");
            return std::future::pending().await;
        };
        let first = match self.caught_early() {
            Some(s) => s,
            None => tokio::select! {
                _ = quit.recv() => ShutdownSignal::GracefulUpgrade,
                _ = term.recv() => ShutdownSignal::GracefulTerminate,
                _ = int.recv() => ShutdownSignal::GracefulTerminate,
            },
        };
        let mut interrupted = false;
        // An upgrade hands the listeners over: the new instance serves on them meanwhile, and
        // the old one is not leaving rotation (its /readyz stays as it is).
        if matches!(first, ShutdownSignal::GracefulTerminate) {
            self.lifecycle.drain();
            if !self.delay.is_zero() {
                tracing::info!(
                    delay_ms = self.delay.as_millis() as u64,
                    "draining: /readyz says 503 and replies close their connections; the \
                     listeners close after the delay"
                );
                // Another SIGTERM ends the delay (the grace period follows); a Ctrl-C ends it
                // and cuts the requests in flight at once.
                tokio::select! {
                    () = tokio::time::sleep(self.delay) => {}
                    _ = term.recv() => tracing::info!("SIGTERM again: the delay is over"),
                    _ = int.recv() => interrupted = true,
                }
            }
        }
        // Whichever began the shutdown, a Ctrl-C now ends its wait.
        let lifecycle = self.lifecycle.clone();
        // Lives until the process ends (it is the Ctrl-C watch of a shutdown).
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move {
            if interrupted || int.recv().await.is_some() {
                tracing::warn!(
                    in_flight = lifecycle.inflight(),
                    "interrupted: ending the requests in flight now"
                );
                lifecycle.cut();
            }
        });
        first
    }
}
