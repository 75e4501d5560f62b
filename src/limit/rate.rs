//! Frequency limits per key: requests per minute, tokens per minute, requests in flight.
//!
//! Why not pingora-limits' `Rate`: it estimates with a count-min sketch over fixed windows, so
//! it may over-count colliding keys and admits up to 2× the limit across a window boundary.
//! Limits here must be exact ("rpm = 100" admits no more than 100 in any 60 s, and the 101st
//! as soon as the first is 60 s old), so each key has a sliding-window log in a `DashMap`: the
//! admissions (or token counts) of the last 60 s, by the millisecond (`Log`). Memory is at
//! most one entry per millisecond of the window per active key, whatever its rate; every check
//! is O(1) amortised, under a per-key mutex that is never held across an await. State is keyed
//! by key id, so it survives a keys reload.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::config::keys::Key;

pub const WINDOW: Duration = Duration::from_secs(60);

/// What the `x-ratelimit-*` headers say about a key after a decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Headroom {
    pub requests: Option<(u64, u64, Duration)>,
    pub tokens: Option<(u64, u64, Duration)>,
    /// `max_concurrent` and the slots left after this request's own.
    pub concurrency: Option<(u32, u32)>,
}

/// A refusal: which limit, and how long until a request would be admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Which limit: `rpm`, `tpm` or `concurrency`.
    pub limit: &'static str,
    pub message: String,
    pub retry_after: Duration,
}

impl Refusal {
    /// The refusal as the client is told it (429, `Retry-After`).
    pub fn into_error(self) -> crate::error::GatewayError {
        crate::error::GatewayError::RateLimited {
            message: self.message,
            retry_after: retry_after_secs(self.retry_after),
            reason: self.limit,
        }
    }
}

pub(super) fn refusal_rpm(rpm: u32, retry_after: Duration) -> Refusal {
    Refusal {
        limit: "rpm",
        message: format!("Rate limit reached: {rpm} requests per minute."),
        retry_after,
    }
}

pub fn refusal_tpm(tpm: u64, retry_after: Duration) -> Refusal {
    Refusal {
        limit: "tpm",
        message: format!("Rate limit reached: {tpm} tokens per minute."),
        retry_after,
    }
}

pub(super) fn refusal_concurrency(max: u32) -> Refusal {
    Refusal {
        limit: "concurrency",
        message: format!("Too many requests in flight: at most {max} at once."),
        retry_after: Duration::from_secs(1),
    }
}

#[derive(Default)]
struct KeyWindows {
    /// Admissions of the last 60 s (rpm).
    requests: Log,
    /// Tokens of the replies that ended in the last 60 s (tpm).
    tokens: Log,
    /// Tokens requests in flight hold against tpm (`budget_mode = "reserve"`).
    held: u64,
    /// The latest time a decision was made at.
    seen: Option<Instant>,
}

impl KeyWindows {
    /// The time a decision is made at: `now`, or the latest one made, if later. Each caller
    /// reads the clock before it takes the lock; decisions go in the lock's order, so one
    /// checked against a log already pruned to a later time is counted at that time.
    fn at(&mut self, now: Instant) -> Instant {
        let now = self.seen.map_or(now, |seen| seen.max(now));
        self.seen = Some(now);
        now
    }

    fn prune(&mut self, now: Instant) {
        self.requests.prune(now);
        self.tokens.prune(now);
    }
}

/// Amounts counted over the last 60 s, by the millisecond: what comes within one millisecond
/// (a thousand admissions of a busy key) is one entry, with the time of its latest. An entry
/// leaves the window once that latest is 60 s old: the count is never below the exact one,
/// and exact when no two came in one millisecond. A log that emptied after a burst gives its
/// memory back (at its key's next request).
#[derive(Default)]
struct Log {
    /// What the entries' times count from (the first entry's time).
    epoch: Option<Instant>,
    /// (nanoseconds from `epoch` to the latest of the entry's millisecond, amount), oldest
    /// first: 16 bytes an entry.
    entries: VecDeque<(u64, u64)>,
    sum: u64,
}

const NANOS_PER_MS: u64 = 1_000_000;

impl Log {
    /// Counts `amount` at `now`, which is no earlier than any time counted before.
    fn add(&mut self, now: Instant, amount: u64) {
        let epoch = *self.epoch.get_or_insert(now);
        let ns = u64::try_from(now.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX);
        match self.entries.back_mut() {
            Some((latest, n)) if *latest / NANOS_PER_MS == ns / NANOS_PER_MS => {
                *latest = (*latest).max(ns);
                *n = n.saturating_add(amount);
            }
            _ => self.entries.push_back((ns, amount)),
        }
        self.sum = self.sum.saturating_add(amount);
    }

    /// When an entry's latest was.
    fn time(&self, latest: u64) -> Instant {
        let epoch = self.epoch.unwrap_or_else(Instant::now);
        epoch + Duration::from_nanos(latest)
    }

    fn prune(&mut self, now: Instant) {
        while let Some(&(latest, n)) = self.entries.front() {
            if now.saturating_duration_since(self.time(latest)) < WINDOW {
                break;
            }
            self.entries.pop_front();
            self.sum = self.sum.saturating_sub(n);
        }
        let cap = self.entries.capacity();
        if cap > 64 && self.entries.len() * 4 < cap {
            self.entries.shrink_to(self.entries.len() * 2);
        }
    }

    /// Time until the oldest entry leaves the window.
    fn reset(&self, now: Instant) -> Duration {
        self.entries.front().map_or(Duration::ZERO, |(latest, _)| {
            (self.time(*latest) + WINDOW).saturating_duration_since(now)
        })
    }

    /// Time until enough entries leave the window for the sum to drop below `limit`.
    fn reset_below(&self, now: Instant, limit: u64) -> Duration {
        let mut sum = self.sum;
        for (latest, n) in &self.entries {
            if sum < limit {
                break;
            }
            sum = sum.saturating_sub(*n);
            if sum < limit {
                return (self.time(*latest) + WINDOW).saturating_duration_since(now);
            }
        }
        Duration::ZERO
    }

    /// For the header: time until the sum drops below `limit` when it is not below, else
    /// until the oldest entry leaves the window and its share comes back (0 only when
    /// nothing is counted).
    fn reset_header(&self, now: Instant, limit: u64) -> Duration {
        let until_allowed = self.reset_below(now, limit);
        if !until_allowed.is_zero() {
            return until_allowed;
        }
        self.reset(now)
    }
}

#[derive(Default)]
pub struct Limiter {
    windows: DashMap<String, Arc<Mutex<KeyWindows>>, foldhash::fast::RandomState>,
}

/// Counts one request of a key in flight (against its `max_concurrent`, if it has one); it
/// ends when the slot drops (reply ended, client gone, or the request refused later on).
#[derive(Debug)]
pub struct Slot(Arc<AtomicU32>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Limiter {
    fn windows(&self, key_id: &str) -> Arc<Mutex<KeyWindows>> {
        if let Some(w) = self.windows.get(key_id) {
            return w.clone();
        }
        self.windows.entry(key_id.to_string()).or_default().clone()
    }

    /// Admits one request of `key` now, or says why not and for how long. Every admitted
    /// request holds a slot while it runs, whether the key has `max_concurrent` or not, so a
    /// limit a keys reload adds counts the requests already running.
    pub fn admit(&self, key: &Key, now: Instant) -> (Result<Option<Slot>, Refusal>, Headroom) {
        if key.rpm.is_none() && key.tpm.is_none() && key.max_concurrent.is_none() {
            key.in_flight.fetch_add(1, Ordering::AcqRel);
            return (Ok(Some(Slot(key.in_flight.clone()))), Headroom::default());
        }
        let windows = self.windows(&key.id);
        let Ok(mut w) = windows.lock() else {
            return (Ok(None), Headroom::default());
        };
        let now = w.at(now);
        w.prune(now);
        let mut head = Headroom::default();
        let mut refusal = None;
        if let Some(tpm) = key.tpm {
            let reset = w.tokens.reset_header(now, tpm);
            let used = w.tokens.sum.saturating_add(w.held);
            head.tokens = Some((tpm, tpm.saturating_sub(used), reset));
            if used >= tpm {
                refusal = Some(refusal_tpm(tpm, reset));
            }
        }
        if let Some(rpm) = key.rpm.map(u64::from) {
            let used = w.requests.sum;
            if refusal.is_none() && used >= rpm {
                let reset = w.requests.reset_below(now, rpm);
                refusal = Some(refusal_rpm(u32::try_from(rpm).unwrap_or(u32::MAX), reset));
            }
        }
        let mut slot = None;
        if let (Some(_), Some(max)) = (&refusal, key.max_concurrent) {
            // Refused by rpm or tpm: the concurrency headroom is told all the same.
            let taken = key.in_flight.load(Ordering::Acquire);
            head.concurrency = Some((max, max.saturating_sub(taken)));
        }
        if refusal.is_none() {
            let counter = &key.in_flight;
            let before = counter.fetch_add(1, Ordering::AcqRel);
            match key.max_concurrent {
                Some(max) if before >= max => {
                    counter.fetch_sub(1, Ordering::AcqRel);
                    refusal = Some(refusal_concurrency(max));
                    head.concurrency = Some((max, 0));
                }
                Some(max) => {
                    slot = Some(Slot(counter.clone()));
                    head.concurrency = Some((max, max - before - 1));
                }
                None => slot = Some(Slot(counter.clone())),
            }
        }
        if refusal.is_none() && key.rpm.is_some() {
            w.requests.add(now, 1);
        }
        if let Some(rpm) = key.rpm.map(u64::from) {
            let used = w.requests.sum;
            let reset = w.requests.reset_header(now, rpm);
            head.requests = Some((rpm, rpm.saturating_sub(used), reset));
        }
        match refusal {
            Some(r) => (Err(r), head),
            None => (Ok(slot), head),
        }
    }

    /// Holds tokens against the key's `tpm` for one request: `decide` is told how many are
    /// left in the window (after every other hold) and says how many to hold, or None to
    /// refuse (the refusal says when the window has room again). None (no hold) for a key
    /// without `tpm`.
    pub fn hold_tokens(
        &self,
        key: &Key,
        now: Instant,
        decide: impl FnOnce(u64) -> Option<u64>,
    ) -> Result<Option<TokenHold>, Refusal> {
        let Some(tpm) = key.tpm else { return Ok(None) };
        let windows = self.windows(&key.id);
        let Ok(mut w) = windows.lock() else {
            return Ok(None);
        };
        let now = w.at(now);
        w.prune(now);
        let left = tpm.saturating_sub(w.tokens.sum.saturating_add(w.held));
        let Some(amount) = decide(left) else {
            // Room comes back when the window's oldest tokens leave it, or a hold ends.
            let reset = w.tokens.reset(now).max(Duration::from_secs(1));
            return Err(refusal_tpm(tpm, reset));
        };
        w.held = w.held.saturating_add(amount);
        drop(w);
        Ok(Some(TokenHold { windows, amount }))
    }

    /// Counts the tokens of a reply that ended, for `tpm`.
    pub fn add_tokens(&self, key: &Key, tokens: u64, now: Instant) {
        if key.tpm.is_none() || tokens == 0 {
            return;
        }
        let windows = self.windows(&key.id);
        if let Ok(mut w) = windows.lock() {
            let now = w.at(now);
            w.prune(now);
            w.tokens.add(now, tokens);
        }
    }
}

/// Tokens held against a key's `tpm` by one request: replaced by its real tokens when it ends
/// (`settle`), released if dropped unsettled.
pub struct TokenHold {
    windows: Arc<Mutex<KeyWindows>>,
    amount: u64,
}

impl std::fmt::Debug for TokenHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenHold")
            .field("amount", &self.amount)
            .finish()
    }
}

impl TokenHold {
    /// Holds `amount` tokens instead (less, once the budget lowered the output).
    pub fn shrink_to(&mut self, amount: u64) {
        if amount < self.amount {
            if let Ok(mut w) = self.windows.lock() {
                w.held = w.held.saturating_sub(self.amount - amount);
                self.amount = amount;
            }
        }
    }

    /// Replaces the hold by the reply's tokens, counted at `now`, in one step.
    pub fn settle(mut self, tokens: u64, now: Instant) {
        let amount = std::mem::take(&mut self.amount);
        if let Ok(mut w) = self.windows.lock() {
            w.held = w.held.saturating_sub(amount);
            let now = w.at(now);
            w.prune(now);
            if tokens > 0 {
                w.tokens.add(now, tokens);
            }
        }
    }
}

impl Drop for TokenHold {
    fn drop(&mut self) {
        if self.amount != 0 {
            if let Ok(mut w) = self.windows.lock() {
                w.held = w.held.saturating_sub(self.amount);
            }
        }
    }
}

/// Writes the `x-ratelimit-*` headers OpenAI sends, for the limits the key has, and
/// `x-ratelimit-{limit,remaining}-concurrency` for `max_concurrent`.
pub fn write_headers(
    head: &Headroom,
    resp: &mut pingora_http::ResponseHeader,
) -> pingora_error::Result<()> {
    if let Some((limit, remaining, reset)) = head.requests {
        resp.insert_header("x-ratelimit-limit-requests", http::HeaderValue::from(limit))?;
        resp.insert_header(
            "x-ratelimit-remaining-requests",
            http::HeaderValue::from(remaining),
        )?;
        resp.insert_header("x-ratelimit-reset-requests", reset_text(reset))?;
    }
    if let Some((limit, remaining, reset)) = head.tokens {
        resp.insert_header("x-ratelimit-limit-tokens", http::HeaderValue::from(limit))?;
        resp.insert_header(
            "x-ratelimit-remaining-tokens",
            http::HeaderValue::from(remaining),
        )?;
        resp.insert_header("x-ratelimit-reset-tokens", reset_text(reset))?;
    }
    if let Some((limit, remaining)) = head.concurrency {
        resp.insert_header(
            "x-ratelimit-limit-concurrency",
            http::HeaderValue::from(limit),
        )?;
        resp.insert_header(
            "x-ratelimit-remaining-concurrency",
            http::HeaderValue::from(remaining),
        )?;
    }
    Ok(())
}

/// Whole seconds for `Retry-After`: rounded up, at least 1.
pub fn retry_after_secs(d: Duration) -> u64 {
    (d.as_millis().div_ceil(1000) as u64).max(1)
}

/// OpenAI's reset format: `20ms`, `1.5s`, `6m0s`.
pub fn reset_text(d: Duration) -> String {
    // One string large enough at once, its numbers by `itoa` (it goes on every reply of a key
    // with limits; `write!` took 600 instructions).
    let mut out = String::with_capacity(16);
    let mut num = itoa::Buffer::new();
    let ms = d.as_millis() as u64;
    if ms < 1000 {
        out.push_str(num.format(ms));
        out.push_str("ms");
    } else if ms < 60_000 {
        let (secs, frac) = (ms / 1000, ms % 1000);
        out.push_str(num.format(secs));
        if frac != 0 {
            // Milliseconds without their trailing zeros: 500 -> "5", 50 -> "05".
            let digits =
                [frac / 100, frac / 10 % 10, frac % 10].map(|d| char::from(b'0' + d as u8));
            let kept = digits.iter().rposition(|&c| c != '0').map_or(0, |i| i + 1);
            out.push('.');
            out.extend(&digits[..kept]);
        }
        out.push('s');
    } else {
        out.push_str(num.format(ms / 60_000));
        out.push('m');
        out.push_str(num.format(ms % 60_000 / 1000));
        out.push('s');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::keys::{KeyTable, sha256};

    fn key(extra: &str) -> Arc<Key> {
        let t = KeyTable::parse(
            "k",
            &format!("[[keys]]\nid='k'\nsecret='sk-12345678'\n{extra}\n"),
        )
        .expect("keys");
        t.get_by_hash(&sha256(b"sk-12345678")).expect("key").clone()
    }

    #[test]
    fn rpm_admits_exactly_the_limit_in_any_window() {
        let k = key("rpm = 3");
        let l = Limiter::default();
        let t0 = Instant::now();
        for i in 0..3 {
            let (r, h) = l.admit(&k, t0 + Duration::from_secs(i * 10));
            assert!(r.is_ok());
            assert_eq!(h.requests.map(|r| r.1), Some(2 - i));
        }
        let (r, _) = l.admit(&k, t0 + Duration::from_secs(30));
        let refusal = r.expect_err("4th in the window");
        assert_eq!(
            refusal.retry_after,
            Duration::from_secs(30),
            "until the first admission is 60 s old"
        );
        assert!(l.admit(&k, t0 + Duration::from_secs(59)).0.is_err());
        assert!(
            l.admit(&k, t0 + Duration::from_secs(60)).0.is_ok(),
            "the first left the window"
        );
    }

    #[test]
    fn a_busy_keys_log_is_one_entry_a_millisecond_and_gives_its_memory_back() {
        let k = key("rpm = 1000000");
        let l = Limiter::default();
        let t0 = Instant::now();
        // 100,000 admissions in 10 ms: counted one by one, kept in 10 entries.
        for i in 0..100_000u64 {
            let (r, h) = l.admit(&k, t0 + Duration::from_nanos(i * 100));
            assert!(r.is_ok());
            assert_eq!(h.requests.map(|r| r.1), Some(1_000_000 - i - 1));
        }
        let windows = l.windows("k");
        assert!(windows.lock().expect("lock").requests.entries.len() <= 10);
        // One a millisecond for 50 s: an entry each; once they are a window old, the log's
        // memory goes back.
        for i in 0..50_000u64 {
            assert!(l.admit(&k, t0 + Duration::from_millis(10 + i)).0.is_ok());
        }
        assert!(windows.lock().expect("lock").requests.entries.capacity() >= 50_000);
        let (_, h) = l.admit(&k, t0 + Duration::from_secs(200));
        assert_eq!(h.requests.map(|r| r.1), Some(999_999));
        assert!(windows.lock().expect("lock").requests.entries.capacity() <= 64);
    }

    #[test]
    fn admissions_within_a_millisecond_leave_the_window_with_the_latest_of_them() {
        let k = key("rpm = 3");
        let l = Limiter::default();
        let t0 = Instant::now();
        for us in [0, 200, 500] {
            assert!(l.admit(&k, t0 + Duration::from_micros(us)).0.is_ok());
        }
        let (r, _) = l.admit(&k, t0 + Duration::from_secs(30));
        let refusal = r.expect_err("4th in the window");
        assert_eq!(
            refusal.retry_after,
            Duration::from_secs(30) + Duration::from_micros(500)
        );
        // Never more than 3 in any 60 s: the first is 60 s old, but not the latest of its
        // millisecond.
        let almost = t0 + WINDOW + Duration::from_micros(400);
        assert!(l.admit(&k, almost).0.is_err());
        assert!(
            l.admit(&k, t0 + WINDOW + Duration::from_micros(500))
                .0
                .is_ok()
        );
    }

    #[test]
    fn a_decision_made_with_an_earlier_clock_reading_counts_at_the_latest_time() {
        let k = key("rpm = 1\ntpm = 1000000");
        let l = Limiter::default();
        let t0 = Instant::now();
        assert!(l.admit(&k, t0).0.is_ok());
        // Another request's end, at t0 + 60 s, prunes the first admission; a request that
        // read the clock just before it takes the lock after it.
        l.add_tokens(&k, 5, t0 + WINDOW);
        let late = Duration::from_micros(1);
        assert!(l.admit(&k, t0 + WINDOW - late).0.is_ok());
        // Counted at t0 + 60 s: one minute on, it is still in the window.
        assert!(l.admit(&k, t0 + 2 * WINDOW - late).0.is_err());
        assert!(l.admit(&k, t0 + 2 * WINDOW).0.is_ok());
    }

    #[test]
    fn tpm_refuses_while_the_window_is_full_and_says_until_when() {
        let k = key("tpm = 100");
        let l = Limiter::default();
        let t0 = Instant::now();
        l.add_tokens(&k, 60, t0);
        l.add_tokens(&k, 50, t0 + Duration::from_secs(20));
        let (r, h) = l.admit(&k, t0 + Duration::from_secs(30));
        assert_eq!(
            r.expect_err("110 >= 100").retry_after,
            Duration::from_secs(30)
        );
        assert_eq!(h.tokens.map(|t| t.1), Some(0));
        assert!(l.admit(&k, t0 + Duration::from_secs(60)).0.is_ok());
    }

    #[test]
    fn concurrency_slots_free_when_dropped() {
        let k = key("max_concurrent = 2");
        let l = Limiter::default();
        let now = Instant::now();
        let a = l.admit(&k, now).0.expect("1");
        let _b = l.admit(&k, now).0.expect("2");
        assert!(l.admit(&k, now).0.is_err());
        drop(a);
        assert!(l.admit(&k, now).0.is_ok());
    }

    #[test]
    fn reset_and_retry_after_formats() {
        assert_eq!(reset_text(Duration::from_millis(20)), "20ms");
        assert_eq!(reset_text(Duration::from_millis(1500)), "1.5s");
        assert_eq!(reset_text(Duration::from_millis(1000)), "1s");
        assert_eq!(reset_text(Duration::from_millis(1050)), "1.05s");
        assert_eq!(reset_text(Duration::from_millis(1005)), "1.005s");
        assert_eq!(reset_text(Duration::from_millis(2250)), "2.25s");
        assert_eq!(reset_text(Duration::from_millis(59_999)), "59.999s");
        assert_eq!(reset_text(Duration::from_secs(360)), "6m0s");
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(29_100)), 30);
    }
}
