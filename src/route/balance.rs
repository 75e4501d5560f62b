//! Which upstream of a pool takes a request, from each upstream's health (`upstream::health`).
//!
//! Selection is written here rather than with pingora-load-balancing: its backend set is keyed
//! by address and weight, so two accounts of one provider (the same URL with different
//! `api_key`s) would collapse into one; it has no least-connections; and its health checks run
//! as a separate service that cannot take the passive signals (a refused connection, a 5xx)
//! the proxy sees on real requests. Everything here is lock-free atomics read per pick.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::config::Strategy;
use crate::upstream::health::{Health, now_ms};

/// The order a pool hands out its upstreams in, built once per config.
pub struct Balancer {
    strategy: Strategy,
    /// Upstream indexes in turn: each once (round robin), or each `weight` times spread out
    /// (smooth weighted round robin, as nginx does it), so no upstream gets a burst.
    turns: Vec<usize>,
    next: AtomicUsize,
}

impl Balancer {
    pub fn new(strategy: Strategy, weights: &[u32]) -> Balancer {
        let turns = match strategy {
            Strategy::Weighted => smooth_weighted(weights),
            _ => (0..weights.len()).collect(),
        };
        Balancer {
            strategy,
            turns,
            next: AtomicUsize::new(0),
        }
    }

    /// The upstream for the next try of a request: a healthy one it has not tried yet, else a
    /// healthy one it has (a pool of one retries its only upstream); None when none is healthy.
    pub fn pick<'h>(
        &self,
        health: impl Fn(usize) -> Option<&'h Health>,
        tried: &[usize],
    ) -> Option<usize> {
        let now = now_ms();
        let n = self.turns.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let ok = |i: usize| health(i).is_some_and(|h| h.healthy(now));
        for fresh in [true, false] {
            let allowed = |i: usize| ok(i) && (!fresh || !tried.contains(&i));
            let found = match self.strategy {
                Strategy::LeastConnections => (0..n)
                    .map(|k| self.turns[(start + k) % n])
                    .filter(|&i| allowed(i))
                    .min_by_key(|&i| health(i).map_or(usize::MAX, |h| h.inflight())),
                _ => (0..n)
                    .map(|k| self.turns[(start + k) % n])
                    .find(|&i| allowed(i)),
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }
}

/// nginx's smooth weighted round robin, unrolled into one cycle of picks.
fn smooth_weighted(weights: &[u32]) -> Vec<usize> {
    let total: i64 = weights.iter().map(|&w| i64::from(w.max(1))).sum();
    let mut current = vec![0i64; weights.len()];
    let mut turns = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, &w) in current.iter_mut().zip(weights) {
            *c += i64::from(w.max(1));
        }
        let Some((best, _)) = current
            .iter()
            .enumerate()
            .max_by_key(|&(i, &c)| (c, -(i as i64)))
        else {
            break;
        };
        current[best] -= total;
        turns.push(best);
    }
    turns
}

/// The wait before try `attempt` (2 for the first retry): min(base × 2^(attempt-2), cap), plus
/// up to 10% jitter, and never less than what the upstream asked for with `Retry-After` when
/// that is within the cap.
pub fn backoff(
    base: Duration,
    cap: Duration,
    attempt: u32,
    retry_after: Option<Duration>,
) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.saturating_sub(2).min(20));
    let delay = exp.min(cap);
    let jitter = delay.mul_f64(rand::random::<f64>() * 0.1);
    let wait = delay + jitter;
    match retry_after {
        Some(ra) if ra <= cap => wait.max(ra),
        _ => wait,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn healths(n: usize) -> Vec<Health> {
        (0..n).map(|_| Health::default()).collect()
    }

    #[test]
    fn round_robin_takes_turns_and_skips_the_unhealthy_and_the_tried() {
        let h = healths(3);
        let refs: Vec<&Health> = h.iter().collect();
        let b = Balancer::new(Strategy::RoundRobin, &[1, 1, 1]);
        let picks: Vec<_> = (0..6)
            .map(|_| b.pick(|i| refs.get(i).copied(), &[]).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        h[1].transport_failed(Duration::from_secs(60));
        let picks: Vec<_> = (0..4)
            .map(|_| b.pick(|i| refs.get(i).copied(), &[]).unwrap())
            .collect();
        assert!(!picks.contains(&1), "{picks:?}");
        assert_eq!(b.pick(|i| refs.get(i).copied(), &[0]), Some(2));
        // Every healthy one tried: a tried one again rather than none.
        assert!(matches!(
            b.pick(|i| refs.get(i).copied(), &[0, 2]),
            Some(0 | 2)
        ));
        h[0].checked(false);
        h[2].checked(false);
        assert_eq!(b.pick(|i| refs.get(i).copied(), &[]), None);
        h[2].checked(true);
        assert_eq!(b.pick(|i| refs.get(i).copied(), &[]), Some(2));
    }

    #[test]
    fn weights_spread_smoothly_in_proportion() {
        let turns = smooth_weighted(&[5, 1, 1]);
        assert_eq!(turns, [0, 0, 1, 0, 2, 0, 0]);
        let h = healths(2);
        let refs: Vec<&Health> = h.iter().collect();
        let b = Balancer::new(Strategy::Weighted, &[3, 1]);
        let picks: Vec<_> = (0..400)
            .map(|_| b.pick(|i| refs.get(i).copied(), &[]).unwrap())
            .collect();
        assert_eq!(picks.iter().filter(|&&i| i == 0).count(), 300);
    }

    #[test]
    fn least_connections_picks_the_least_busy() {
        let h = healths(3);
        let refs: Vec<&Health> = h.iter().collect();
        let b = Balancer::new(Strategy::LeastConnections, &[1, 1, 1]);
        let _a = h[0].enter();
        let _b = h[0].enter();
        let _c = h[2].enter();
        assert_eq!(b.pick(|i| refs.get(i).copied(), &[]), Some(1));
        assert_eq!(b.pick(|i| refs.get(i).copied(), &[1]), Some(2));
    }

    #[test]
    fn backoff_doubles_to_the_cap_with_at_most_ten_percent_jitter_and_honours_retry_after() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_millis(1_000);
        for (attempt, want) in [
            (2, 100),
            (3, 200),
            (4, 400),
            (5, 800),
            (6, 1_000),
            (30, 1_000),
        ] {
            for _ in 0..50 {
                let w = backoff(base, cap, attempt, None).as_millis() as u64;
                assert!(w >= want && w <= want + want / 10, "{attempt}: {w}");
            }
        }
        let ra = Some(Duration::from_millis(700));
        assert!(backoff(base, cap, 2, ra) >= Duration::from_millis(700));
        let far = Some(Duration::from_secs(60));
        assert!(backoff(base, cap, 2, far) < Duration::from_millis(111));
    }
}
