//! Console sign-in, the guard over all addresses. Each address has its own throttle
//! (`auth::throttle`); a crowd of addresses, each under it, could still guess at speed. So
//! failed sign-ins are also counted across all addresses: past `BUDGET` in a minute, an attempt
//! from an address that has not signed in before waits its turn at one password check per
//! `GATE_EVERY` for all such addresses together (a wait of `WAIT_MAX` at most; past that it is
//! answered 429 with `Retry-After`). An address that signed in before goes straight on: the
//! console's own users are not locked out by someone guessing.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed sign-ins across all addresses in a minute before the gate closes.
pub const BUDGET: usize = 30;
/// While the gate is closed: one attempt from a new address per this, for all of them.
pub const GATE_EVERY: Duration = Duration::from_secs(1);
/// The longest an attempt waits for its turn; past it, 429.
pub const WAIT_MAX: Duration = Duration::from_secs(2);
const WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered as having signed in (client ids, `throttle::client_id`); past this
/// many the oldest are forgotten.
const KNOWN_MAX: usize = 1024;

/// Failed sign-ins written to the audit log one by one in a minute; the rest are summed up in
/// one entry (`Audit::Summary`).
pub const AUDITED_FAILURES: u32 = 60;

#[derive(Default)]
struct State {
    failures: VecDeque<Instant>,
    /// The next turn at the gate.
    next_turn: Option<Instant>,
    known: HashSet<u64>,
    known_order: VecDeque<u64>,
    /// The audit window: its start, failures in it, and those of the last window not listed.
    audit: Option<(Instant, u32)>,
}

#[derive(Default)]
pub struct Guard {
    state: Mutex<State>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").finish_non_exhaustive()
    }
}

/// What to write to the audit log for a failed sign-in.
#[derive(Debug, PartialEq, Eq)]
pub enum Audit {
    /// The failure, as an entry of its own.
    Entry,
    /// Nothing now (counted in metrics; summed up when the minute ends).
    Skip,
    /// The failure's entry, after one summing up the `n` failures of the minute before that
    /// were not listed.
    SummaryThenEntry(u32),
}

impl Guard {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When an attempt from `client` may have its password checked: now (`Ok(None)`), after
    /// a wait (`Ok(Some(wait))`), or not within `WAIT_MAX` (`Err(retry_after)`).
    pub fn turn(&self, client: Option<u64>, now: Instant) -> Result<Option<Duration>, Duration> {
        let mut s = self.state();
        while s
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) >= WINDOW)
        {
            s.failures.pop_front();
        }
        let known = client.is_some_and(|c| s.known.contains(&c));
        if s.failures.len() < BUDGET || known {
            return Ok(None);
        }
        let turn = s.next_turn.map_or(now, |t| t.max(now));
        let wait = turn.saturating_duration_since(now);
        if wait > WAIT_MAX {
            return Err(wait - WAIT_MAX + GATE_EVERY);
        }
        s.next_turn = Some(turn + GATE_EVERY);
        Ok((!wait.is_zero()).then_some(wait))
    }

    /// A failed sign-in: counted toward the budget; what the audit log gets for it.
    pub fn failed(&self, now: Instant) -> Audit {
        let mut s = self.state();
        s.failures.push_back(now);
        // Bounded: only the count within the window matters.
        while s.failures.len() > BUDGET * 4 {
            s.failures.pop_front();
        }
        if let Some((start, n)) = s.audit.as_mut() {
            if now.saturating_duration_since(*start) < WINDOW {
                *n += 1;
                return if *n <= AUDITED_FAILURES {
                    Audit::Entry
                } else {
                    Audit::Skip
                };
            }
        }
        let unlisted = s
            .audit
            .map_or(0, |(_, n)| n.saturating_sub(AUDITED_FAILURES));
        s.audit = Some((now, 1));
        if unlisted > 0 {
            Audit::SummaryThenEntry(unlisted)
        } else {
            Audit::Entry
        }
    }

    /// The failures of a minute that ended unlisted, taken once: summed up for the audit log
    /// when no later failure came to write them (the log is read, or someone signs in).
    pub fn unlisted(&self, now: Instant) -> Option<u32> {
        let mut s = self.state();
        let (start, n) = s.audit?;
        if now.saturating_duration_since(start) < WINDOW || n <= AUDITED_FAILURES {
            return None;
        }
        s.audit = None;
        Some(n - AUDITED_FAILURES)
    }

    /// A guard that knows the addresses the audit log says signed in (`login` entries, newest
    /// first as `audit_list` gives them): the console's users go past the gate after a restart
    /// too.
    pub fn knowing(audit: &[crate::store::console::AuditEntry]) -> Guard {
        let g = Guard::default();
        let clients = audit
            .iter()
            .filter(|e| e.action == "login")
            .filter_map(|e| {
                let detail: serde_json::Value = serde_json::from_str(&e.detail).ok()?;
                detail["client"].as_str()?.parse::<std::net::IpAddr>().ok()
            })
            .map(crate::auth::throttle::client_id);
        let mut seen: Vec<u64> = Vec::new();
        for c in clients {
            if !seen.contains(&c) && seen.len() < KNOWN_MAX {
                seen.push(c);
            }
        }
        // Oldest first, so that the newest are the last forgotten.
        for c in seen.into_iter().rev() {
            g.signed_in(Some(c));
        }
        g
    }

    /// `client` signed in: it goes past the gate from now on.
    pub fn signed_in(&self, client: Option<u64>) {
        let Some(c) = client else { return };
        let mut s = self.state();
        if s.known.insert(c) {
            s.known_order.push_back(c);
            if s.known_order.len() > KNOWN_MAX {
                if let Some(old) = s.known_order.pop_front() {
                    s.known.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the budget, new addresses take turns (one a second, a wait of two at most, then
    /// 429); an address that signed in before goes straight on.
    #[test]
    fn past_the_budget_new_addresses_take_turns_and_known_ones_go_on() {
        let g = Guard::default();
        let t0 = Instant::now();
        g.signed_in(Some(7));
        for i in 0..BUDGET as u64 {
            assert_eq!(g.turn(Some(100 + i), t0), Ok(None));
            g.failed(t0);
        }
        assert_eq!(g.turn(Some(7), t0), Ok(None));
        assert_eq!(g.turn(Some(1), t0), Ok(None));
        assert_eq!(g.turn(Some(2), t0), Ok(Some(GATE_EVERY)));
        assert_eq!(g.turn(Some(3), t0), Ok(Some(2 * GATE_EVERY)));
        assert!(g.turn(Some(4), t0).is_err());
        assert_eq!(g.turn(Some(7), t0), Ok(None));
        // A minute on, the failures have left the window.
        assert_eq!(g.turn(Some(5), t0 + WINDOW), Ok(None));
    }

    /// Sixty failures a minute are listed one by one; the rest of that minute are summed up
    /// in one entry with the next minute's first failure.
    #[test]
    fn failures_past_sixty_a_minute_are_summed_up() {
        let g = Guard::default();
        let t0 = Instant::now();
        let audits: Vec<Audit> = (0..100).map(|_| g.failed(t0)).collect();
        assert_eq!(audits.iter().filter(|a| **a == Audit::Entry).count(), 60);
        assert_eq!(audits.iter().filter(|a| **a == Audit::Skip).count(), 40);
        assert_eq!(g.failed(t0 + WINDOW), Audit::SummaryThenEntry(40));
        assert_eq!(g.failed(t0 + WINDOW), Audit::Entry);
    }

    /// Addresses the audit log says signed in go past the gate; failed ones do not.
    #[test]
    fn addresses_that_signed_in_before_a_restart_go_past_the_gate() {
        let entry = |action: &str, client: &str| crate::store::console::AuditEntry {
            time_ms: 0,
            user: "admin".into(),
            action: action.into(),
            key_id: String::new(),
            detail: serde_json::json!({ "client": client }).to_string(),
        };
        let g = Guard::knowing(&[
            entry("login", "10.0.0.7"),
            entry("login_failed", "10.0.0.8"),
        ]);
        let t0 = Instant::now();
        for _ in 0..BUDGET {
            g.failed(t0);
        }
        let id = |ip: &str| {
            Some(crate::auth::throttle::client_id(
                ip.parse().expect("an address"),
            ))
        };
        assert_eq!(g.turn(id("10.0.0.7"), t0), Ok(None));
        assert_eq!(
            g.turn(id("10.0.0.8"), t0),
            Ok(None),
            "the gate's first turn"
        );
        assert_eq!(g.turn(id("10.0.0.9"), t0), Ok(Some(GATE_EVERY)));
    }

    /// A minute's unlisted failures are taken once when no later failure comes.
    #[test]
    fn unlisted_failures_are_taken_once_the_minute_ended() {
        let g = Guard::default();
        let t0 = Instant::now();
        for _ in 0..70 {
            g.failed(t0);
        }
        assert_eq!(g.unlisted(t0), None, "the minute goes on");
        assert_eq!(g.unlisted(t0 + WINDOW), Some(10));
        assert_eq!(g.unlisted(t0 + WINDOW), None);
        assert_eq!(g.failed(t0 + WINDOW), Audit::Entry);
    }
}
