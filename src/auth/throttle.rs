//! Guessing guard: wrong keys presented to `/v1`, the usage and billing APIs are counted per
//! client address in a sliding minute (`[limits] auth_failures_per_minute`, default 10); past
//! the limit that address gets 429 with `Retry-After` until its oldest failure leaves the
//! window, for any key it has not used before. So no path can be used to try keys at speed,
//! while one client with a wrong key cannot lock out the others behind its address (a NAT):
//! a key already used from that address goes on working (`Key::last_client`).
//!
//! Counted exactly, per address, not with pingora-limits' count-min sketch (which the usage
//! calls' bound uses): a sketch's counts are shared between addresses whose hashes collide,
//! so an attack from many addresses (100,000 each under the limit fill every cell of 4 × 1024)
//! would make every address look over it and lock out the legitimate clients too. Memory is
//! bounded here instead by sweeping (`MAX_TRACKED`).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use dashmap::DashMap;

pub use crate::config::FAILURES_PER_WINDOW;
pub const WINDOW: Duration = Duration::from_secs(60);

/// While an address is throttled, a key it used last goes on working, but only until its wrong
/// keys reach this many times the limit: then nothing from it passes until they age out, so
/// no one behind it guesses on at speed (a right guess would pass where a wrong one counts).
pub const HARD_FACTOR: usize = 3;

/// Addresses tracked before stale ones are swept, at most once every `SWEEP_EVERY` (each sweep
/// walks them all).
const SWEEP_AT: usize = 65_536;
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Addresses tracked at most: past it a sweep drops those whose last failure is oldest, so an
/// attack from many addresses (an IPv6 /48 holds 65,536 /64s) bounds memory, and the address
/// that is guessing now keeps its count.
const MAX_TRACKED: usize = 131_072;

/// Who is counted as one client: an IPv4 address, or an IPv6 /64 (one host usually holds a
/// whole /64, so counting single IPv6 addresses would let it try endlessly).
fn group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let mut seg = v6.segments();
            seg[4..].fill(0);
            IpAddr::V6(seg.into())
        }
    }
}

/// The client as the throttle counts it, as a number (never 0): the IPv4 address, or the
/// IPv6 /64.
pub fn client_id(ip: IpAddr) -> u64 {
    match group(ip) {
        IpAddr::V4(v4) => (1 << 32) | u64::from(u32::from(v4)),
        IpAddr::V6(v6) => (u128::from(v6) >> 64) as u64 | (1 << 63),
    }
}

#[derive(Debug)]
pub struct Throttle {
    failures: DashMap<IpAddr, VecDeque<Instant>>,
    limit: usize,
    window: Duration,
    /// When the last sweep ran; held while one runs.
    swept: std::sync::Mutex<Option<Instant>>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(FAILURES_PER_WINDOW, WINDOW)
    }
}

impl Throttle {
    /// `limit` failures a minute; 0: no limit.
    pub fn per_minute(limit: usize) -> Throttle {
        Throttle::new(if limit == 0 { usize::MAX } else { limit }, WINDOW)
    }

    pub fn new(limit: usize, window: Duration) -> Throttle {
        Throttle {
            failures: DashMap::new(),
            limit: limit.max(1),
            window,
            swept: std::sync::Mutex::new(None),
        }
    }

    /// Ok, or how long until this address may try again, and whether it is past the hard
    /// limit (`HARD_FACTOR` times the limit).
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), (Duration, bool)> {
        let Some(mut log) = self.failures.get_mut(&group(ip)) else {
            return Ok(());
        };
        self.expire(&mut log, now);
        if log.len() < self.limit {
            return Ok(());
        }
        // Under the limit again once this many of the oldest have left the window.
        let freeing = log.get(log.len() - self.limit).copied().unwrap_or(now);
        let hard = log.len() >= self.limit.saturating_mul(HARD_FACTOR);
        Err(((freeing + self.window).saturating_duration_since(now), hard))
    }

    /// Counts an attempt as failed before it is checked, atomically with the limit check, so
    /// parallel attempts cannot all pass a check made before any failure was counted. Ok (the
    /// attempt may go on; call `forgive` if it succeeds), or how long until the next may.
    pub fn begin(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        self.sweep(now);
        let mut log = self.failures.entry(group(ip)).or_default();
        self.expire(&mut log, now);
        if log.len() >= self.limit {
            let oldest = log.front().copied().unwrap_or(now);
            return Err((oldest + self.window).saturating_duration_since(now));
        }
        log.push_back(now);
        Ok(())
    }

    /// Takes back the attempt `begin` counted, once it turned out right.
    pub fn forgive(&self, ip: IpAddr) {
        if let Some(mut log) = self.failures.get_mut(&group(ip)) {
            log.pop_back();
        }
    }

    fn sweep(&self, now: Instant) {
        if self.failures.len() < SWEEP_AT {
            return;
        }
        // One sweep at a time, once a second at most: the others go on without.
        let Ok(mut swept) = self.swept.try_lock() else {
            return;
        };
        if swept.is_some_and(|t| now.saturating_duration_since(t) < SWEEP_EVERY) {
            return;
        }
        *swept = Some(now);
        let window = self.window;
        self.failures.retain(|_, log| {
            log.back()
                .is_some_and(|t| now.saturating_duration_since(*t) < window)
        });
        let over = self.failures.len().saturating_sub(MAX_TRACKED);
        if over > 0 {
            // Those with the fewest failures go first, then the stalest: an address locked out
            // (its attempts refused, not counted, so its last failure ages) is never dropped
            // for the addresses an attack fills the map with.
            let rank = |log: &VecDeque<Instant>| log.back().map(|t| (log.len(), *t));
            let mut ranks: Vec<(usize, Instant)> =
                self.failures.iter().filter_map(|e| rank(&e)).collect();
            let Some(at) = ranks.len().checked_sub(1).map(|end| over.min(end)) else {
                return;
            };
            let cutoff = *ranks.select_nth_unstable(at).1;
            // Exactly `over` go: all below the cutoff, then as many at it as are still due.
            let below = ranks.iter().filter(|r| **r < cutoff).count();
            let mut ties = over.saturating_sub(below);
            self.failures.retain(|_, log| match rank(log) {
                Some(r) if r < cutoff => false,
                Some(r) if r == cutoff && ties > 0 => {
                    ties -= 1;
                    false
                }
                Some(_) => true,
                None => false,
            });
        }
    }

    /// Counts one wrong key from `ip` (at most `HARD_FACTOR` times the limit are kept).
    pub fn fail(&self, ip: IpAddr, now: Instant) {
        self.sweep(now);
        let mut log = self.failures.entry(group(ip)).or_default();
        self.expire(&mut log, now);
        if log.len() >= self.limit.saturating_mul(HARD_FACTOR) {
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
        assert_eq!(wait, (Duration::from_secs(50), false));
        assert!(
            t.check(b, t0 + Duration::from_secs(10)).is_ok(),
            "per address"
        );
        assert!(t.check(a, t0 + Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn failures_past_the_limit_count_on_to_the_hard_limit_and_no_further() {
        let t = Throttle::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..10 * HARD_FACTOR - 1 {
            t.fail(a, t0);
        }
        assert_eq!(t.check(a, t0), Err((Duration::from_secs(60), false)));
        t.fail(a, t0 + Duration::from_secs(1));
        assert_eq!(
            t.check(a, t0 + Duration::from_secs(1)),
            Err((Duration::from_secs(59), true))
        );
        // More are not kept: the log stays at the hard limit, and ages out as it came.
        for _ in 0..100 {
            t.fail(a, t0 + Duration::from_secs(2));
        }
        assert_eq!(t.failures.get(&a).map(|l| l.len()), Some(10 * HARD_FACTOR));
        assert!(t.check(a, t0 + Duration::from_secs(62)).is_ok());
    }

    #[test]
    fn parallel_attempts_are_counted_before_they_are_checked_and_v6_counts_per_64() {
        let t = Throttle::default();
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8::ffff:1".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..5 {
            assert!(t.begin(a, t0).is_ok());
        }
        for _ in 0..5 {
            assert!(t.begin(same_64, t0).is_ok());
        }
        assert!(
            t.begin(a, t0).is_err(),
            "the 11th attempt in flight is refused"
        );
        t.forgive(a);
        assert!(
            t.begin(same_64, t0).is_ok(),
            "a right attempt is not counted"
        );
        let other: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        assert!(t.begin(other, t0).is_ok());
    }

    #[test]
    fn addresses_past_the_cap_are_swept_stalest_first_and_the_guessing_one_is_kept() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let v6 = |n: u32| {
            IpAddr::V6(std::net::Ipv6Addr::new(
                0x2001,
                0xdb8,
                (n >> 16) as u16,
                n as u16,
                0,
                0,
                0,
                1,
            ))
        };
        let guesser = v6(0);
        for n in 1..=(MAX_TRACKED as u32 + 1_000) {
            t.fail(v6(n), t0 + Duration::from_millis(u64::from(n % 900)));
        }
        for _ in 0..5 {
            t.fail(guesser, t0 + Duration::from_millis(1_500));
        }
        // Swept once (at SWEEP_AT), not again within the second.
        assert!(t.failures.len() > MAX_TRACKED);
        t.fail(guesser, t0 + Duration::from_secs(2));
        assert!(t.failures.len() <= MAX_TRACKED, "{}", t.failures.len());
        assert_eq!(t.failures.get(&group(guesser)).map(|l| l.len()), Some(6));
        // An address locked out a while ago (its last failure the oldest of all) stays too:
        // the fewest failures go first.
        let locked = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 9));
        for _ in 0..10 {
            t.fail(locked, t0);
        }
        for n in 200_000..(200_000 + 2_000) {
            t.fail(v6(n), t0 + Duration::from_millis(3_500));
        }
        t.fail(guesser, t0 + Duration::from_secs(5));
        assert!(t.failures.len() <= MAX_TRACKED + 1, "{}", t.failures.len());
        assert_eq!(t.failures.get(&locked).map(|l| l.len()), Some(10));
        // Past the window everything stale goes.
        t.fail(guesser, t0 + Duration::from_secs(70));
        assert_eq!(t.failures.len(), 1);
    }
}
