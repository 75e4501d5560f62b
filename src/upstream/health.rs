//! Upstream stage: each upstream's health as the gateway sees it (the active check's verdict, a
//! passive cool-down after failed requests, requests in flight). Lock-free atomics, read by the
//! route stage's balancer on every pick.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Consecutive 5xx replies that take an upstream out of rotation (a single one is often about
/// the request, not the server). A failed connection, reset or timeout takes it out at once.
pub const EJECT_AFTER_5XX: u32 = 3;

/// Milliseconds since the process's first call: a monotonic clock that fits an atomic.
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// One upstream's health: the active check's verdict, a passive cool-down, requests in flight.
#[derive(Debug, Default)]
pub struct Health {
    /// The last active check failed (until one passes).
    check_failed: AtomicBool,
    /// Out of rotation until this `now_ms()` after failed requests (0: not ejected).
    ejected_until: AtomicU64,
    consecutive_5xx: AtomicU32,
    inflight: AtomicUsize,
    requests: AtomicU64,
    failures: AtomicU64,
}

impl Health {
    pub fn healthy(&self, now: u64) -> bool {
        !self.check_failed.load(Ordering::Relaxed)
            && self.ejected_until.load(Ordering::Relaxed) <= now
    }

    /// A request to this upstream starts; it counts as in flight until the guard drops.
    pub fn enter(&self) -> InFlight<'_> {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// A request counted by `enter` is over: its guard dropped, or the task a kept count went
    /// with (`InFlight::keep`) ended it.
    pub fn end_kept(&self) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
    }

    /// The upstream answered with a reply that says nothing against it.
    pub fn answered(&self) {
        self.consecutive_5xx.store(0, Ordering::Relaxed);
    }

    /// No reply: refused, reset or timed out. Out of rotation for the cool-down.
    pub fn transport_failed(&self, cooldown: Duration) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.eject(cooldown);
    }

    /// A 5xx reply: out of rotation once `EJECT_AFTER_5XX` come in a row.
    pub fn server_error(&self, cooldown: Duration) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if self.consecutive_5xx.fetch_add(1, Ordering::Relaxed) + 1 >= EJECT_AFTER_5XX {
            self.consecutive_5xx.store(0, Ordering::Relaxed);
            self.eject(cooldown);
        }
    }

    /// A failure that takes nothing out of rotation (counted for the admin view).
    pub fn count_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    fn eject(&self, cooldown: Duration) {
        let until = now_ms() + cooldown.as_millis() as u64;
        self.ejected_until.fetch_max(until, Ordering::Relaxed);
    }

    /// The active check's verdict. A pass also ends a passive cool-down: the upstream answers.
    pub fn checked(&self, ok: bool) -> bool {
        if ok {
            self.ejected_until.store(0, Ordering::Relaxed);
            self.consecutive_5xx.store(0, Ordering::Relaxed);
        }
        self.check_failed.swap(!ok, Ordering::Relaxed) == ok
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }

    /// For the admin view: (check failed, ms of cool-down left, in flight, requests, failures).
    pub fn view(&self, now: u64) -> (bool, u64, usize, u64, u64) {
        (
            self.check_failed.load(Ordering::Relaxed),
            self.ejected_until
                .load(Ordering::Relaxed)
                .saturating_sub(now),
            self.inflight(),
            self.requests.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }
}

pub struct InFlight<'a>(&'a Health);

impl InFlight<'_> {
    /// The request goes on in a task of its own (`proxy::detach`): it counts until that task
    /// ends it (`Health::end_kept`).
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.end_kept();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_hundreds_eject_only_in_a_row_and_a_passing_check_brings_it_back() {
        let h = Health::default();
        let now = now_ms();
        h.server_error(Duration::from_secs(60));
        h.server_error(Duration::from_secs(60));
        h.answered();
        h.server_error(Duration::from_secs(60));
        assert!(h.healthy(now));
        h.server_error(Duration::from_secs(60));
        h.server_error(Duration::from_secs(60));
        assert!(!h.healthy(now_ms()));
        assert!(!h.checked(true), "no change of the check's verdict");
        assert!(h.healthy(now_ms()));
        assert!(h.checked(false), "a change");
        assert!(!h.healthy(now_ms()));
    }
}
