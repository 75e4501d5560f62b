//! Web stage, guessing guard: wrong keys presented to the usage and billing APIs are counted per
//! client address in a sliding minute; past the limit that address gets 429 with `Retry-After`
//! (whatever key it sends) until its oldest failure leaves the window. So neither the usage page
//! nor `/api/usage` can be used to try keys at speed.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use dashmap::DashMap;

/// Failed attempts allowed per address per window.
pub const FAILURES_PER_WINDOW: usize = 10;
pub const WINDOW: Duration = Duration::from_secs(60);

/// Addresses tracked before stale ones are swept (bounds memory under a spread-out attack).
const SWEEP_AT: usize = 65_536;

#[derive(Debug)]
pub struct Throttle {
    failures: DashMap<IpAddr, VecDeque<Instant>>,
    limit: usize,
    window: Duration,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(FAILURES_PER_WINDOW, WINDOW)
    }
}

impl Throttle {
    pub fn new(limit: usize, window: Duration) -> Throttle {
        Throttle {
            failures: DashMap::new(),
            limit: limit.max(1),
            window,
        }
    }

    /// Ok, or how long until this address may try again.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let Some(mut log) = self.failures.get_mut(&ip) else {
            return Ok(());
        };
        self.expire(&mut log, now);
        if log.len() < self.limit {
            return Ok(());
        }
        let oldest = log.front().copied().unwrap_or(now);
        Err((oldest + self.window).saturating_duration_since(now))
    }

    /// Counts one wrong key from `ip`.
    pub fn fail(&self, ip: IpAddr, now: Instant) {
        if self.failures.len() >= SWEEP_AT {
            let window = self.window;
            self.failures
                .retain(|_, log| log.back().is_some_and(|t| now.duration_since(*t) < window));
        }
        let mut log = self.failures.entry(ip).or_default();
        self.expire(&mut log, now);
        if log.len() >= self.limit {
            log.pop_front();
        }
        log.push_back(now);
    }

    fn expire(&self, log: &mut VecDeque<Instant>, now: Instant) {
        while log
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.window)
        {
            log.pop_front();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_eleventh_failure_in_a_minute_is_refused_until_the_first_expires() {
        let t = Throttle::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let t0 = Instant::now();
        for i in 0..10 {
            assert!(t.check(a, t0 + Duration::from_secs(i)).is_ok());
            t.fail(a, t0 + Duration::from_secs(i));
        }
        let wait = t.check(a, t0 + Duration::from_secs(10)).unwrap_err();
        assert_eq!(wait, Duration::from_secs(50));
        assert!(
            t.check(b, t0 + Duration::from_secs(10)).is_ok(),
            "per address"
        );
        assert!(t.check(a, t0 + Duration::from_secs(60)).is_ok());
    }
}
