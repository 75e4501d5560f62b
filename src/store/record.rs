//! The usage record: one per request that passed auth, whatever its outcome. Its CSV header
//! and column order are fixed by the contract; `estimated` follows them.

use std::io::Write;

use serde_json::{Value, json};

pub const CSV_HEADER: &str = "time,request_id,key_id,listener,endpoint,model,status,stream,prompt_tokens,completion_tokens,total_tokens,cost,latency_ms,ttft_ms,upstream,estimated,attempts,served_model,cut,cached_prompt_tokens,cache_write_tokens,reasoning_tokens";

/// Serialized only to the spool (`store::spool`), never to clients: they get `to_json`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UsageRecord {
    /// Unix milliseconds when the request arrived.
    pub time_ms: i64,
    pub request_id: String,
    pub key_id: String,
    /// `main` or `direct`.
    pub listener: String,
    /// The contract's endpoint group (`chat`, `embeddings`, …, `models`, `usage`).
    pub endpoint: String,
    /// The model the request was served as: the id asked for, an alias's model, or the
    /// default model an unknown id took (the id asked for when refused; "" when none).
    pub model: String,
    pub status: u16,
    pub stream: bool,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Credits.
    pub cost: f64,
    pub latency_ms: u64,
    /// Time to the first content byte; None when no content was sent.
    pub ttft_ms: Option<u64>,
    /// Base URL of the upstream that served it ("" when none was contacted).
    pub upstream: String,
    /// Tokens were counted by the gateway's tokenizer, not reported by the upstream.
    pub estimated: bool,
    /// Tries it took upstream (0: the upstream was never asked).
    pub attempts: u32,
    /// The model whose pool answered: `model`, or the fallback that took it ("" when none).
    pub served_model: String,
    /// Why the reply was cut short: `client`, `upstream`, `budget`, `shutdown`, `crash` ("" when
    /// it was not).
    #[serde(default)]
    pub cut: String,
    /// Of `prompt_tokens`: read from the provider's prompt cache.
    #[serde(default)]
    pub cached_prompt_tokens: u64,
    /// Of `prompt_tokens`: written to the provider's prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Of `completion_tokens`: the model's reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

/// A record borrowed from what its request holds: what the journal writes before the request
/// ends (no string of it copied), and what `UsageRecord` is made from.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct RecordRef<'a> {
    pub time_ms: i64,
    pub request_id: &'a str,
    pub key_id: &'a str,
    pub listener: &'a str,
    pub endpoint: &'a str,
    pub model: &'a str,
    pub status: u16,
    pub stream: bool,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub cost: f64,
    pub latency_ms: u64,
    pub ttft_ms: Option<u64>,
    pub upstream: &'a str,
    pub estimated: bool,
    pub attempts: u32,
    pub served_model: &'a str,
    pub cut: &'a str,
    pub cached_prompt_tokens: u64,
    pub cache_write_tokens: u64,
    pub reasoning_tokens: u64,
}

impl RecordRef<'_> {
    pub fn to_record(&self) -> UsageRecord {
        UsageRecord {
            time_ms: self.time_ms,
            request_id: self.request_id.to_string(),
            key_id: self.key_id.to_string(),
            listener: self.listener.to_string(),
            endpoint: self.endpoint.to_string(),
            model: self.model.to_string(),
            status: self.status,
            stream: self.stream,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            total_tokens: self.total_tokens,
            cost: self.cost,
            latency_ms: self.latency_ms,
            ttft_ms: self.ttft_ms,
            upstream: self.upstream.to_string(),
            estimated: self.estimated,
            attempts: self.attempts,
            served_model: self.served_model.to_string(),
            cut: self.cut.to_string(),
            cached_prompt_tokens: self.cached_prompt_tokens,
            cache_write_tokens: self.cache_write_tokens,
            reasoning_tokens: self.reasoning_tokens,
        }
    }
}

/// The rollup row's model for the records of models the gateway does not serve.
pub const UNKNOWN_MODEL: &str = "(unknown)";

impl UsageRecord {
    /// The record, borrowed.
    pub fn borrowed(&self) -> RecordRef<'_> {
        RecordRef {
            time_ms: self.time_ms,
            request_id: &self.request_id,
            key_id: &self.key_id,
            listener: &self.listener,
            endpoint: &self.endpoint,
            model: &self.model,
            status: self.status,
            stream: self.stream,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            total_tokens: self.total_tokens,
            cost: self.cost,
            latency_ms: self.latency_ms,
            ttft_ms: self.ttft_ms,
            upstream: &self.upstream,
            estimated: self.estimated,
            attempts: self.attempts,
            served_model: &self.served_model,
            cut: &self.cut,
            cached_prompt_tokens: self.cached_prompt_tokens,
            cache_write_tokens: self.cache_write_tokens,
            reasoning_tokens: self.reasoning_tokens,
        }
    }

    /// The model the record's usage is summed under (rollups, summaries): its own, or
    /// `(unknown)` for a model nobody serves, so that names a client makes up leave no state
    /// of their own: every 404 that names a model (the gateway's `model_not_found`, or an
    /// upstream's for an id a glob sent it; a 404 bills nothing), as the record itself says,
    /// stored and read back.
    pub fn rollup_model(&self) -> &str {
        if self.status == 404 && !self.model.is_empty() {
            UNKNOWN_MODEL
        } else {
            &self.model
        }
    }
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-22T13:07:16.648Z`.
pub fn format_time(ms: i64) -> String {
    let mut s = Vec::with_capacity(24);
    write_time(&mut s, ms);
    String::from_utf8(s).unwrap_or_default()
}

/// Appends `format_time(ms)`. Written by hand: an export formats a million of these, and the
/// `time` crate's formatter was a tenth of its cost (benches/usage_scale.rs). Years outside
/// 0..=9999 go through `time` instead.
pub fn write_time(out: &mut Vec<u8>, ms: i64) {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    if !(0..=9999).contains(&y) {
        return write_time_slow(out, ms);
    }
    let sod = secs.rem_euclid(86_400);
    let mut buf = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, n: i64| {
        let mut n = n;
        for i in (at..at + width).rev() {
            buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, y);
    put(5, 2, m);
    put(8, 2, d);
    put(11, 2, sod / 3600);
    put(14, 2, sod / 60 % 60);
    put(17, 2, sod % 60);
    put(20, 3, ms.rem_euclid(1000));
    out.extend_from_slice(&buf);
}

fn write_time_slow(out: &mut Vec<u8>, ms: i64) {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let f = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    out.extend_from_slice(t.format(&f).unwrap_or_default().as_bytes());
}

/// (year, month, day) of a count of days since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn csv_field(out: &mut Vec<u8>, s: &[u8]) {
    // A cell a spreadsheet would run as a formula is defused with a leading quote (OWASP),
    // and so is one that starts with whitespace or a newline (which some spreadsheets skip
    // before the `=`) or with a full-width `＝＋－＠` (which some read as the ASCII sign).
    let formula = starts_like_a_formula(s);
    // A byte scan: every delimiter is ASCII, and exports call this five times a row. A `;` or
    // tab is quoted too: a spreadsheet of a locale that splits on it keeps the cell whole
    // (`x;=cmd` would otherwise give a cell `=cmd` that runs).
    let quote = s
        .iter()
        .any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r' | b';' | b'\t'));
    if quote {
        out.push(b'"');
    }
    if formula {
        out.push(b'\'');
    }
    if quote {
        for (i, part) in s.split(|&b| b == b'"').enumerate() {
            if i > 0 {
                out.extend_from_slice(b"\"\"");
            }
            out.extend_from_slice(part);
        }
        out.push(b'"');
    } else {
        out.extend_from_slice(s);
    }
}

/// Whether a cell's text starts as a spreadsheet formula might: `=`, `+`, `-`, `@`, their
/// full-width forms (U+FF1D, U+FF0B, U+FF0D, U+FF20), or any whitespace (a newline included).
fn starts_like_a_formula(s: &[u8]) -> bool {
    match s.first() {
        None => false,
        Some(b'=' | b'+' | b'-' | b'@') => true,
        Some(b) if b.is_ascii() => b.is_ascii_whitespace() || *b == 0x0b,
        // The cell's first character (a prefix of at most 4 bytes, decoded as far as it is
        // valid UTF-8).
        Some(_) => {
            let head = &s[..s.len().min(4)];
            let text = match std::str::from_utf8(head) {
                Ok(t) => t,
                Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default(),
            };
            text.chars()
                .next()
                .is_some_and(|c| c.is_whitespace() || matches!(c, '＝' | '＋' | '－' | '＠'))
        }
    }
}

/// Appends `v` in decimal, without the formatting machinery (six of these a row).
fn push_u64(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends `v` exactly as `Display` writes it (the shortest text that reads back as `v`, never
/// an exponent). ryu writes it when that text has at most 15 significant digits: then exactly
/// one such text reads back as `v`, so both must agree (with 17 they may pick different
/// neighbours). `Display` writes the rest. A fifth of an export's formatting time went to
/// `core::fmt` here.
fn push_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        let mut buf = ryu::Buffer::new();
        let s = buf.format_finite(v);
        let s = s.strip_suffix(".0").unwrap_or(s);
        let significant = s
            .bytes()
            .filter(u8::is_ascii_digit)
            .skip_while(|&b| b == b'0')
            .count();
        if significant <= 15 && !s.contains('e') {
            out.extend_from_slice(s.as_bytes());
            return;
        }
    }
    let _ = write!(out, "{v}");
}

/// One record's fields as CSV wants them, borrowed: from a `UsageRecord`, or straight from a
/// store row (an export then copies no string and checks no UTF-8 twice).
pub struct CsvRow<'a> {
    pub time_ms: i64,
    pub request_id: &'a [u8],
    pub key_id: &'a [u8],
    pub listener: &'a [u8],
    pub endpoint: &'a [u8],
    pub model: &'a [u8],
    pub status: u64,
    pub stream: bool,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub cost: f64,
    pub latency_ms: u64,
    pub ttft_ms: Option<u64>,
    pub upstream: &'a [u8],
    pub estimated: bool,
    pub attempts: u64,
    pub served_model: &'a [u8],
    pub cut: &'a [u8],
    /// The prompt's cached and cache-write tokens, and the output's reasoning tokens.
    pub details: [u64; 3],
}

impl CsvRow<'_> {
    /// Appends one CSV line (with its `\n`) in the header's column order.
    pub fn write(&self, out: &mut Vec<u8>) {
        write_time(out, self.time_ms);
        out.push(b',');
        csv_field(out, self.request_id);
        out.push(b',');
        csv_field(out, self.key_id);
        out.push(b',');
        csv_field(out, self.listener);
        out.push(b',');
        csv_field(out, self.endpoint);
        out.push(b',');
        csv_field(out, self.model);
        out.push(b',');
        push_u64(out, self.status);
        out.extend_from_slice(if self.stream { b",true," } else { b",false," });
        push_u64(out, self.prompt_tokens);
        out.push(b',');
        push_u64(out, self.completion_tokens);
        out.push(b',');
        push_u64(out, self.total_tokens);
        out.push(b',');
        push_f64(out, self.cost);
        out.push(b',');
        push_u64(out, self.latency_ms);
        out.push(b',');
        if let Some(t) = self.ttft_ms {
            push_u64(out, t);
        }
        out.push(b',');
        csv_field(out, self.upstream);
        out.extend_from_slice(if self.estimated {
            b",true,"
        } else {
            b",false,"
        });
        push_u64(out, self.attempts);
        out.push(b',');
        csv_field(out, self.served_model);
        out.push(b',');
        csv_field(out, self.cut);
        for n in self.details {
            out.push(b',');
            push_u64(out, n);
        }
        out.push(b'\n');
    }
}

impl UsageRecord {
    /// Appends one CSV line (with its `\n`) in the header's column order.
    pub fn write_csv(&self, out: &mut Vec<u8>) {
        CsvRow {
            time_ms: self.time_ms,
            request_id: self.request_id.as_bytes(),
            key_id: self.key_id.as_bytes(),
            listener: self.listener.as_bytes(),
            endpoint: self.endpoint.as_bytes(),
            model: self.model.as_bytes(),
            status: u64::from(self.status),
            stream: self.stream,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            total_tokens: self.total_tokens,
            cost: self.cost,
            latency_ms: self.latency_ms,
            ttft_ms: self.ttft_ms,
            upstream: self.upstream.as_bytes(),
            estimated: self.estimated,
            attempts: u64::from(self.attempts),
            served_model: self.served_model.as_bytes(),
            cut: self.cut.as_bytes(),
            details: [
                self.cached_prompt_tokens,
                self.cache_write_tokens,
                self.reasoning_tokens,
            ],
        }
        .write(out);
    }

    pub fn to_json(&self) -> Value {
        json!({
            "time": format_time(self.time_ms),
            "request_id": self.request_id,
            "key_id": self.key_id,
            "listener": self.listener,
            "endpoint": self.endpoint,
            "model": self.model,
            "status": self.status,
            "stream": self.stream,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cost": self.cost,
            "latency_ms": self.latency_ms,
            "ttft_ms": self.ttft_ms,
            "upstream": self.upstream,
            "estimated": self.estimated,
            "attempts": self.attempts,
            "served_model": self.served_model,
            "cut": self.cut,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_display_writes_them() {
        let mut cases = vec![
            0.0,
            -0.0,
            1.0,
            0.000_125,
            0.1 + 0.2,
            1e-7,
            1e15,
            1e16,
            1e17,
            1e21,
            123_456.789,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        // Every kind of bit pattern (xorshift), and the sums of small prices a cost is made of.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(f64::from_bits(x));
            cases.push(f64::from(i) * 0.000_001_5 + f64::from(i % 7) * 0.03);
        }
        for v in cases {
            let mut out = Vec::new();
            push_f64(&mut out, v);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!("{v}"),
                "{:x}",
                v.to_bits()
            );
        }
    }

    pub fn sample() -> UsageRecord {
        UsageRecord {
            time_ms: 1_795_353_265_123,
            request_id: "req_1".into(),
            key_id: "demo".into(),
            listener: "main".into(),
            endpoint: "chat".into(),
            model: "echo,\"1\"".into(),
            status: 200,
            stream: true,
            prompt_tokens: 4,
            completion_tokens: 8,
            total_tokens: 12,
            cost: 0.5,
            latency_ms: 12,
            ttft_ms: None,
            upstream: "http://127.0.0.1:9100".into(),
            estimated: false,
            attempts: 1,
            served_model: "echo,\"1\"".into(),
            cut: String::new(),
            cached_prompt_tokens: 1,
            cache_write_tokens: 2,
            reasoning_tokens: 3,
        }
    }

    #[test]
    fn csv_rows_follow_the_header_and_quote_what_needs_it() {
        let mut out = Vec::new();
        sample().write_csv(&mut out);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "2026-11-22T13:14:25.123Z,req_1,demo,main,chat,\"echo,\"\"1\"\"\",200,true,4,8,12,0.5,12,,http://127.0.0.1:9100,false,1,\"echo,\"\"1\"\"\",,1,2,3\n"
        );
        assert_eq!(CSV_HEADER.split(',').count(), 22);
        let v = sample().to_json();
        let keys: Vec<&str> = CSV_HEADER.split(',').collect();
        for k in keys {
            assert!(v.get(k).is_some(), "json lacks {k}");
        }
    }

    #[test]
    fn hand_written_times_equal_the_time_crates() {
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut cases = vec![
            0,
            -1,
            999,
            1_000,
            951_782_400_000,
            4_107_542_399_999,
            -62_135_596_800_000,
        ];
        for _ in 0..100_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            cases.push((seed % 400_000_000_000_000) as i64 - 100_000_000_000_000);
        }
        for ms in cases {
            let mut slow = Vec::new();
            write_time_slow(&mut slow, ms);
            assert_eq!(format_time(ms).as_bytes(), slow, "{ms}");
        }
    }

    /// The field writer against the plain definition (defuse, then quote if needed).
    #[test]
    fn fields_match_the_plain_definition() {
        fn reference(s: &str) -> String {
            let formula = s.starts_with(['=', '+', '-', '@', '＝', '＋', '－', '＠'])
                || s.starts_with(char::is_whitespace);
            let s = if formula {
                format!("'{s}")
            } else {
                s.to_string()
            };
            if s.contains([',', '"', '\n', '\r', ';', '\t']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s
            }
        }
        for s in [
            "",
            "plain",
            "a,b",
            "\"",
            "\"\"",
            "=1+2",
            "=a,\"b\"",
            "@x\n",
            "-",
            "+\r",
            "é,ü\"日本",
            "\"start",
            "end\"",
            "mid\"dle",
            "x;=cmd|' /C calc'!A0;y",
            "a\t=1",
            " =1+2",
            "\n=1+2",
            "\u{b}=1",
            "\u{a0}=1",
            "\u{3000}=1",
            "＝1+2",
            "＋1",
            "－1",
            "＠SUM(A1)",
            "日本",
            "é",
        ] {
            let mut out = Vec::new();
            csv_field(&mut out, s.as_bytes());
            assert_eq!(out, reference(s).as_bytes(), "{s:?}");
        }
        for v in [0u64, 7, 10, 99, 100, 12_345, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }

    #[test]
    fn formula_cells_are_defused() {
        let mut r = sample();
        r.model = "=HYPERLINK(\"x\")".into();
        let mut out = Vec::new();
        r.write_csv(&mut out);
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains(",\"'=HYPERLINK(\"\"x\"\")\","), "{out}");
        for (model, cell) in [
            ("\t=1+1", ",\"'\t=1+1\","),
            ("\r=1+1", ",\"'\r=1+1\","),
            ("x;=1+1", ",\"x;=1+1\","),
        ] {
            r.model = model.into();
            let mut out = Vec::new();
            r.write_csv(&mut out);
            let out = String::from_utf8(out).unwrap();
            assert!(out.contains(cell), "{out:?}");
        }
    }

    #[test]
    fn times_format_as_rfc3339_utc_with_milliseconds() {
        assert_eq!(format_time(1_795_353_265_123), "2026-11-22T13:14:25.123Z");
    }
}
