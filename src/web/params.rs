//! Web stage, query strings: percent-decoding, refusal of parameters an endpoint does not take
//! (a typo must not silently widen a query), and the time and time-zone values the usage APIs
//! accept.

use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::{Offset, TimeZone};

use crate::error::GatewayError;

/// Unix seconds at or beyond this are taken for an epoch in milliseconds (it is the year 5138).
const MS_EPOCH_FROM: i64 = 100_000_000_000;

/// A client's value as quoted back in an error: at most 64 characters.
pub fn shown(v: &str) -> String {
    match v.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &v[..i]),
        None => v.to_string(),
    }
}

fn bad(param: &'static str, message: String) -> GatewayError {
    GatewayError::InvalidParameter { param, message }
}

/// The query's pairs, decoded; a parameter that is not in `allowed` (or comes twice) is a 400.
/// Returns them keyed by the allowed names, so callers match on `&'static str`.
pub fn parse(
    query: Option<&str>,
    allowed: &[&'static str],
) -> Result<Vec<(&'static str, String)>, GatewayError> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = decode(k);
        let Some(name) = allowed.iter().find(|a| **a == k) else {
            let k = shown(&k);
            let message = format!(
                "Unknown query parameter '{k}'. This endpoint takes: {}.",
                allowed.join(", ")
            );
            return Err(bad("query", message));
        };
        if out.iter().any(|(n, _)| n == name) {
            return Err(bad(name, format!("'{name}' is given more than once.")));
        }
        out.push((name, decode(v)));
    }
    Ok(out)
}

pub use crate::auth::decode_query as decode;

/// `tz`: `UTC`, a fixed offset (`+05:30`, `-08:00`, `+0530`), or an IANA name
/// (`Asia/Kolkata`). A `+` that arrived unencoded (as a space) is read as `+`.
pub fn zone(s: &str) -> Result<TimeZone, GatewayError> {
    let t = s.trim_end();
    let t = match t.strip_prefix(' ') {
        Some(rest) => format!("+{}", rest.trim_start()),
        None => t.to_string(),
    };
    if t.eq_ignore_ascii_case("utc") || t == "Z" || t.is_empty() {
        return Ok(TimeZone::UTC);
    }
    if let Some(offset) = fixed_offset(&t) {
        return Ok(TimeZone::fixed(offset));
    }
    TimeZone::get(&t).map_err(|_| {
        let message = format!(
            "'{}' is not a time zone: use UTC, an offset such as +05:30, or an IANA name such as Asia/Kolkata.",
            shown(s)
        );
        bad("tz", message)
    })
}

fn fixed_offset(s: &str) -> Option<Offset> {
    let sign = match s.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits: String = s[1..].chars().filter(|c| *c != ':').collect();
    if !(digits.len() == 2 || digits.len() == 4) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let h: i32 = digits[..2].parse().ok()?;
    let m: i32 = digits.get(2..).map_or(Ok(0), str::parse).ok()?;
    // Summaries are built from 15-minute rollups: an offset off that grid would cut buckets.
    if h > 18 || m > 59 || m % 15 != 0 {
        return None;
    }
    Offset::from_seconds(sign * (h * 3600 + m * 60)).ok()
}

/// A `start`/`end` value → unix milliseconds. Accepts RFC 3339 with `Z` or `±hh:mm` (also when
/// the `+` arrived unencoded as a space), `YYYY-MM-DD` (midnight in `tz`), and unix seconds
/// (fractions allowed). An epoch in milliseconds is refused with a clear message rather than
/// read as a date thousands of years ahead.
pub fn time(param: &'static str, s: &str, tz: &TimeZone) -> Result<i64, GatewayError> {
    let v = s.trim();
    let q = shown(v);
    let numeric = !v.is_empty()
        && v.bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_digit() || b == b'.' || (i == 0 && b == b'-'));
    if numeric {
        let secs: f64 = v
            .parse()
            .map_err(|_| bad(param, format!("'{q}' is not a number of unix seconds.")))?;
        if secs.abs() >= MS_EPOCH_FROM as f64 {
            let message = format!(
                "'{q}' looks like unix milliseconds; '{param}' takes unix seconds, RFC 3339 or YYYY-MM-DD."
            );
            return Err(bad(param, message));
        }
        return Ok((secs * 1000.0).round() as i64);
    }
    if v.len() == 10 {
        if let Ok(d) = v.parse::<Date>() {
            let midnight = d
                .to_zoned(tz.clone())
                .map_err(|e| bad(param, format!("'{q}': {e}")))?;
            return Ok(midnight.timestamp().as_millisecond());
        }
    }
    let parsed = v.parse::<Timestamp>().or_else(|e| {
        // `…T10:00:00 05:30`: a `+` sent unencoded in a query string decodes to a space.
        match v.rfind(' ') {
            Some(i) if i >= 16 => format!("{}+{}", &v[..i], &v[i + 1..]).parse::<Timestamp>(),
            _ => Err(e),
        }
    });
    parsed.map(|t| t.as_millisecond()).map_err(|_| {
        let message = format!(
            "'{q}' is not a time: use RFC 3339 (2026-11-22T10:00:00+05:30), YYYY-MM-DD or unix seconds."
        );
        bad(param, message)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn times_in_every_accepted_form() {
        let utc = TimeZone::UTC;
        let t = |s: &str| time("start", s, &utc);
        assert_eq!(t("1795353265").unwrap(), 1_795_353_265_000);
        assert_eq!(t("1795353265.5").unwrap(), 1_795_353_265_500);
        assert_eq!(t("2026-11-22T13:14:25.123Z").unwrap(), 1_795_353_265_123);
        assert_eq!(
            t("2026-11-22T18:44:25.123+05:30").unwrap(),
            1_795_353_265_123
        );
        // The `+` of the offset sent unencoded arrives as a space.
        assert_eq!(
            t(&decode("2026-11-22T18:44:25.123+05:30")).unwrap(),
            1_795_353_265_123
        );
        assert_eq!(t("2026-11-22").unwrap(), 1_795_305_600_000);
        let ist = zone("Asia/Kolkata").unwrap();
        assert_eq!(
            time("start", "2026-11-22", &ist).unwrap(),
            1_795_305_600_000 - 19_800_000
        );
        for bad in ["1795353265123", "yesterday", "2026-13-01", "", "12:00"] {
            let e = t(bad).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
        }
        let msg = String::from_utf8(t("1795353265123").unwrap_err().body()).unwrap();
        assert!(msg.contains("milliseconds"), "{msg}");
        let huge = "9".repeat(5_000);
        let msg = String::from_utf8(t(&huge).unwrap_err().body()).unwrap();
        assert!(
            msg.len() < 400,
            "a long value is not echoed whole: {}",
            msg.len()
        );
    }

    #[test]
    fn zones_by_name_offset_or_utc() {
        assert_eq!(zone("UTC").unwrap(), TimeZone::UTC);
        let at = Timestamp::from_second(1_795_353_265).unwrap();
        for (s, secs) in [
            ("+05:30", 19_800),
            (" 05:30", 19_800),
            ("-0800", -28_800),
            ("Asia/Kolkata", 19_800),
        ] {
            assert_eq!(zone(s).unwrap().to_offset(at).seconds(), secs, "{s}");
        }
        for bad in ["Mars/Olympus", "+25:00", "+5", "+05:17"] {
            assert!(zone(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_and_repeated_parameters_are_refused() {
        let ok = parse(Some("start=1&order=desc"), &["start", "order"]).unwrap();
        assert_eq!(
            ok,
            vec![("start", "1".to_string()), ("order", "desc".to_string())]
        );
        let e = parse(Some("start=1&strat=2"), &["start"]).unwrap_err();
        assert!(String::from_utf8(e.body()).unwrap().contains("strat"));
        assert!(parse(Some("start=1&start=2"), &["start"]).is_err());
    }
}
