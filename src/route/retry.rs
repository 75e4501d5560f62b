//! The retry policy: what to do after one try of a request on a pool, from what was tried,
//! what came back and the time left. Pure: forwarding asks it after each try and carries the
//! answer out (a wait, another try, the reply passed on, the next route).

use std::time::Duration;

/// What a try came to before any of its reply reached the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tried {
    /// No reply: a failed connect, a reset, a timeout, a broken reply header.
    Failed,
    /// A reply header with this status, and the `Retry-After` it carried.
    Replied {
        status: u16,
        retry_after: Option<Duration>,
    },
}

/// Where the request stands after the try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// This try's number, from 1.
    pub attempt: u32,
    /// The pool's `max_attempts`.
    pub max_attempts: u32,
    /// What is left of a plain request's whole deadline; None for a stream.
    pub time_left: Option<Duration>,
    /// Whether an upstream of the pool other than the ones tried is healthy now.
    pub others_healthy: bool,
    /// Whether any upstream of the pool is healthy now, tried or not.
    pub any_healthy: bool,
    /// Whether a fallback route follows this pool.
    pub fallback: bool,
    /// The pool's `retry_cap`: the longest wait between tries.
    pub retry_cap: Duration,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The reply goes to the client, whatever its status.
    PassOn,
    /// Wait the pool's backoff, at least `Retry-After` when one is given, then try again.
    Wait { retry_after: Option<Duration> },
    /// Try again at once (no upstream is healthy to wait for: the next pick finds none or one
    /// that came back).
    Again,
    /// The pool cannot answer: the next route (a fallback model) takes the request, or, with
    /// none, the client gets the failure.
    NextRoute,
}

impl Tried {
    /// 429 and 5xx (but 501, which no retry changes) may be answered otherwise by another try.
    pub fn retryable(self) -> bool {
        match self {
            Tried::Failed => true,
            Tried::Replied { status, .. } => status == 429 || (status >= 500 && status != 501),
        }
    }
}

/// The decision after a try.
pub fn next(tried: Tried, s: &Standing) -> Next {
    // The request's last try on this pool: its attempts are spent, or a plain request's
    // whole deadline is.
    let last = s.attempt >= s.max_attempts || s.time_left == Some(Duration::ZERO);
    match tried {
        Tried::Failed if last => Next::NextRoute,
        Tried::Failed if s.any_healthy => Next::Wait { retry_after: None },
        Tried::Failed => Next::Again,
        Tried::Replied { .. } if !tried.retryable() => Next::PassOn,
        // With no fallback, the last try's reply is the client's, 429 or 5xx.
        Tried::Replied { .. } if last && !s.fallback => Next::PassOn,
        Tried::Replied { retry_after, .. } => {
            // Another upstream can take it now; only the same one must be waited for, and not
            // longer than the pool's cap.
            let too_long = retry_after.is_some_and(|ra| ra > s.retry_cap);
            if last || (!s.others_healthy && too_long) {
                if s.fallback {
                    Next::NextRoute
                } else {
                    Next::PassOn
                }
            } else if s.others_healthy {
                Next::Wait { retry_after: None }
            } else {
                Next::Wait { retry_after }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn standing(attempt: u32, others: bool, fallback: bool) -> Standing {
        Standing {
            attempt,
            max_attempts: 3,
            time_left: None,
            others_healthy: others,
            any_healthy: true,
            fallback,
            retry_cap: 5 * S,
        }
    }

    fn replied(status: u16, retry_after: Option<Duration>) -> Tried {
        Tried::Replied {
            status,
            retry_after,
        }
    }

    #[test]
    fn the_retry_policy_as_a_table() {
        let wait = |ra| Next::Wait { retry_after: ra };
        #[rustfmt::skip]
        let table: &[(Tried, Standing, Next)] = &[
            // A success or a client's error goes to the client at once.
            (replied(200, None), standing(1, true, true), Next::PassOn),
            (replied(400, None), standing(1, true, true), Next::PassOn),
            (replied(501, None), standing(1, true, true), Next::PassOn),
            // 429 and 5xx: another upstream at once (after the backoff), Retry-After ignored.
            (replied(429, Some(3 * S)), standing(1, true, false), wait(None)),
            (replied(503, None), standing(2, true, false), wait(None)),
            // The same upstream only: its Retry-After is honoured, up to the cap.
            (replied(429, Some(3 * S)), standing(1, false, false), wait(Some(3 * S))),
            (replied(429, Some(60 * S)), standing(1, false, false), Next::PassOn),
            (replied(429, Some(60 * S)), standing(1, false, true), Next::NextRoute),
            // The last try's 429/5xx: the client's, unless a fallback follows.
            (replied(500, None), standing(3, true, false), Next::PassOn),
            (replied(500, None), standing(3, true, true), Next::NextRoute),
            // No reply: another try after the backoff, at once when nothing is healthy to
            // wait for, and the next route after the last.
            (Tried::Failed, standing(1, true, false), wait(None)),
            (Tried::Failed, Standing { any_healthy: false, ..standing(1, false, false) }, Next::Again),
            (Tried::Failed, standing(3, true, false), Next::NextRoute),
            (Tried::Failed, standing(3, true, true), Next::NextRoute),
            // A plain request past its whole deadline: no further try, whatever is left.
            (replied(503, None), Standing { time_left: Some(Duration::ZERO), ..standing(1, true, false) }, Next::PassOn),
            (Tried::Failed, Standing { time_left: Some(Duration::ZERO), ..standing(1, true, false) }, Next::NextRoute),
            (replied(503, None), Standing { time_left: Some(S), ..standing(1, true, false) }, wait(None)),
        ];
        for (tried, standing, expected) in table {
            assert_eq!(next(*tried, standing), *expected, "{tried:?} {standing:?}");
        }
    }
}
