//! A request's final status: settled once, at its end (`proxy::finish`), from what the writer
//! recorded as sent to the client (`respond::Sent`) and the failure that ended the request, if
//! one did. That status is what its usage record, access-log line, metrics and spans say, and
//! what its spend is decided on. Nothing else names it.

use pingora_error::{Error, ErrorSource, ErrorType};

use crate::http1::respond::{Cut, Sent};

/// The failure that ended a request, as its error says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The client went away (or took nothing within its send timeout).
    Client,
    /// The shutdown's grace period was over.
    Shutdown,
    /// The gateway's or the upstream's failure, with the status its answer has (502 for an
    /// upstream that broke off, 504 for one that stalled, 500 for the gateway's own).
    Status(u16),
}

impl Failure {
    pub fn of(e: &Error) -> Failure {
        if crate::http1::respond::is_shutdown_cut(e) {
            return Failure::Shutdown;
        }
        match super::reply::classify_failure(e) {
            Some(g) => Failure::Status(g.status()),
            None => Failure::Client,
        }
    }

    /// Not an error of the gateway's, worth no log line: a client that left, or the
    /// shutdown's cut (the drain logs it once for all).
    pub fn quiet(self, e: &Error) -> bool {
        matches!(self, Failure::Client | Failure::Shutdown)
            || e.esource() == &ErrorSource::Downstream
    }
}

/// The status a client left with, for one whose connection closed under it.
pub const CLIENT_GONE: u16 = 499;

/// The request's final status. A reply that went whole is what the client got, whatever
/// happened after. One that did not: cut by a failed write (the client's doing, 499, or the
/// shutdown's, 503), else by the failure that ended the request (the client gone, the
/// shutdown, the upstream or the gateway: the failure's status). A reply whose header went and
/// that ended with no failure (a body the session ends itself) is its header's status.
pub fn settle(sent: &Sent, failure: Option<Failure>) -> u16 {
    let shutdown = crate::error::GatewayError::ShuttingDown.status();
    if sent.whole {
        if let Some(status) = sent.status {
            return status;
        }
    }
    match (sent.cut, failure) {
        (Some(Cut::Client), _) => CLIENT_GONE,
        (Some(Cut::Shutdown), _) => shutdown,
        (None, Some(Failure::Client)) => CLIENT_GONE,
        (None, Some(Failure::Shutdown)) => shutdown,
        (None, Some(Failure::Status(s))) => s,
        // Ended with nothing to say why: the reply the client got (the session ends its body),
        // or, with none, the gateway's own failure to answer.
        (None, None) => sent.status.unwrap_or(500),
    }
}

/// Why a request's reply was cut short, for its record: by the client (also one that left
/// before the reply began), the shutdown, or the upstream (a reply that began and failed);
/// "" for a reply that went whole or an error answered in full.
pub fn cut(sent: &Sent, failure: Option<Failure>) -> &'static str {
    if sent.whole {
        return "";
    }
    match (sent.cut, failure) {
        (Some(Cut::Client), _) | (None, Some(Failure::Client)) => "client",
        (Some(Cut::Shutdown), _) | (None, Some(Failure::Shutdown)) => "shutdown",
        (None, Some(Failure::Status(_))) if sent.began() => "upstream",
        _ => "",
    }
}

/// The error a request ends with when its client went away before its reply began.
pub fn client_left() -> Box<Error> {
    Error::explain(ErrorType::ConnectionClosed, "the client went away").into_down()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(status: Option<u16>, whole: bool, cut: Option<Cut>) -> Sent {
        Sent {
            status,
            bytes: 0,
            whole,
            cut,
        }
    }

    #[test]
    fn the_final_status_is_settled_from_what_was_sent_and_the_failure() {
        use Failure::*;
        let client = Some(Client);
        let shutdown = Some(Shutdown);
        let cases: &[(Sent, Option<Failure>, u16, &str)] = &[
            (
                sent(Some(200), true, None),
                None,
                200,
                "a success sent whole",
            ),
            (
                sent(Some(401), true, None),
                None,
                401,
                "a refusal sent whole",
            ),
            (
                sent(Some(200), true, None),
                client,
                200,
                "whole, then the client left",
            ),
            (
                sent(Some(401), true, None),
                shutdown,
                401,
                "a refusal stays what it was",
            ),
            (
                sent(Some(429), true, None),
                client,
                429,
                "an upstream's 429 passed on",
            ),
            (
                sent(Some(504), true, None),
                client,
                504,
                "a 504 answered whole",
            ),
            (
                sent(Some(200), false, None),
                Some(Status(502)),
                502,
                "upstream broke off",
            ),
            (
                sent(Some(200), false, None),
                Some(Status(504)),
                504,
                "upstream stalled",
            ),
            (
                sent(Some(200), false, None),
                client,
                499,
                "client left mid-stream",
            ),
            (
                sent(Some(200), false, None),
                shutdown,
                503,
                "shutdown mid-stream",
            ),
            (
                sent(Some(200), false, Some(Cut::Client)),
                Some(Status(502)),
                499,
                "write failed first",
            ),
            (
                sent(Some(200), false, Some(Cut::Shutdown)),
                client,
                503,
                "the shutdown's cut",
            ),
            (
                sent(Some(502), false, Some(Cut::Client)),
                None,
                499,
                "an error nobody read",
            ),
            (
                sent(None, false, Some(Cut::Client)),
                None,
                499,
                "the header never went",
            ),
            (
                sent(None, false, None),
                client,
                499,
                "left before any reply",
            ),
            (
                sent(None, false, None),
                shutdown,
                503,
                "shut down before any reply",
            ),
            (
                sent(None, false, None),
                Some(Status(500)),
                500,
                "the gateway failed",
            ),
            (
                sent(Some(200), false, None),
                Some(Status(500)),
                500,
                "an export that failed",
            ),
            (
                sent(Some(200), false, None),
                None,
                200,
                "a body the session ends",
            ),
            (
                sent(None, false, None),
                None,
                500,
                "nothing sent, nothing said",
            ),
            (sent(None, true, None), None, 500, "an end without a header"),
        ];
        for (s, f, want, what) in cases {
            assert_eq!(settle(s, *f), *want, "{what}: {s:?} {f:?}");
        }
    }

    #[test]
    fn a_failure_is_named_by_its_error() {
        let client = Error::explain(ErrorType::WriteError, "gone").into_down();
        let upstream = Error::explain(ErrorType::ReadError, "cut").into_up();
        let stalled = Error::explain(ErrorType::ReadTimedout, "slow").into_up();
        let shutdown = crate::http1::respond::shutdown_cut();
        assert_eq!(Failure::of(&client), Failure::Client);
        assert_eq!(Failure::of(&client_left()), Failure::Client);
        assert_eq!(Failure::of(&upstream), Failure::Status(502));
        assert_eq!(Failure::of(&stalled), Failure::Status(504));
        assert_eq!(Failure::of(&shutdown), Failure::Shutdown);
        assert!(Failure::of(&client).quiet(&client));
        assert!(!Failure::of(&upstream).quiet(&upstream));
    }

    #[test]
    fn a_cut_is_named_for_the_record() {
        use Failure::*;
        let began = |whole, cut| sent(Some(200), whole, cut);
        assert_eq!(
            cut(&began(true, None), Some(Status(502))),
            "",
            "it went whole"
        );
        assert_eq!(cut(&began(false, Some(Cut::Client)), None), "client");
        assert_eq!(cut(&sent(None, false, None), Some(Client)), "client");
        assert_eq!(cut(&began(false, Some(Cut::Shutdown)), None), "shutdown");
        assert_eq!(cut(&sent(None, false, None), Some(Shutdown)), "shutdown");
        assert_eq!(cut(&began(false, None), Some(Status(504))), "upstream");
        assert_eq!(
            cut(&sent(None, false, None), Some(Status(502))),
            "",
            "answered 502"
        );
        assert_eq!(cut(&sent(None, false, None), None), "");
    }
}
