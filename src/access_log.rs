//! The access log: one structured line per request (JSON, or logfmt) on stdout, apart from the
//! gateway's own log on stderr (so `jq` reads it whole), or appended to `[log] access_file`;
//! made from the request's usage record plus what the record does not hold (method, path,
//! client address, user agent, trace id). Lines are formatted on the request's thread and
//! written by one background thread through a buffer flushed whenever the queue runs dry, so a
//! request never waits on the output. `[log] access = "on" | "off" | <sample rate in 0..1>`;
//! secrets never appear (the record holds the key's id, never the key).

use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use crate::store::UsageRecord;
use crate::store::record::format_time;

/// Lines queued for the writer; past this they are dropped (and counted), never blocking.
const QUEUE: usize = 65_536;

/// What a request's line carries beside its record.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// The client's address (the one `[server] trusted_proxies` name, behind them).
    pub client: Option<std::net::IpAddr>,
    pub user_agent: Option<&'a str>,
    /// The W3C trace id (32 hex digits) the request was traced under.
    pub trace_id: Option<u128>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    Json,
    Logfmt,
}

pub struct AccessLog {
    tx: SyncSender<String>,
    /// Share of requests logged (1.0: every one).
    rate: f64,
    format: Format,
    dropped: std::sync::atomic::AtomicU64,
}

impl AccessLog {
    /// Starts the writer thread, to `file` (appended) or stdout; None when the log is off.
    pub fn start(rate: f64, format: Format, file: Option<&std::path::Path>) -> Option<AccessLog> {
        if rate <= 0.0 {
            return None;
        }
        let out: Box<dyn Write + Send> = match file {
            Some(path) => match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                Ok(f) => Box::new(f),
                Err(e) => {
                    tracing::error!(
                        "access log: cannot open {}: {e}; writing to stdout",
                        path.display()
                    );
                    Box::new(std::io::stdout())
                }
            },
            None => Box::new(std::io::stdout()),
        };
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(rx, out))
            .ok()?;
        Some(AccessLog {
            tx,
            rate: rate.min(1.0),
            format,
            dropped: Default::default(),
        })
    }

    /// Logs the request, if sampled.
    pub fn log(&self, r: &UsageRecord, seen: &Seen<'_>) {
        if self.rate < 1.0 && rand::random::<f64>() >= self.rate {
            return;
        }
        let line = match self.format {
            Format::Json => json_line(r, seen),
            Format::Logfmt => logfmt_line(r, seen),
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send(line) {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

fn write_lines(rx: Receiver<String>, out: Box<dyn Write + Send>) {
    // Not `stdout().lock()`: a lock held while waiting for lines would block every other
    // writer of stdout for good. The buffer locks it once per flush.
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    while let Ok(line) = rx.recv() {
        let _ = out.write_all(line.as_bytes());
        // Write what else is queued, then flush once the queue is empty.
        while let Ok(more) = rx.try_recv() {
            let _ = out.write_all(more.as_bytes());
        }
        let _ = out.flush();
    }
}

fn trace_hex(id: Option<u128>) -> String {
    id.map(|t| format!("{t:032x}")).unwrap_or_default()
}

fn json_line(r: &UsageRecord, seen: &Seen<'_>) -> String {
    let mut line = serde_json::json!({
        "time": format_time(r.time_ms),
        "type": "access",
        "request_id": r.request_id,
        "listener": r.listener,
        "method": seen.method,
        "path": seen.path,
        "client": seen.client.map(|c| c.to_string()),
        "user_agent": seen.user_agent,
        "trace_id": seen.trace_id.map(|t| trace_hex(Some(t))),
        "key_id": r.key_id,
        "endpoint": r.endpoint,
        "model": r.model,
        "served_model": r.served_model,
        "upstream": r.upstream,
        "status": r.status,
        "stream": r.stream,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.total_tokens,
        "cost": r.cost,
        "latency_ms": r.latency_ms,
        "ttft_ms": r.ttft_ms,
        "attempts": r.attempts,
        "cut": r.cut,
    })
    .to_string();
    line.push('\n');
    line
}

/// `key=value` pairs; a value with a space, quote or `=` is quoted with `"` escaped.
fn logfmt_line(r: &UsageRecord, seen: &Seen<'_>) -> String {
    let mut line = String::with_capacity(256);
    let mut put = |k: &str, v: &str| {
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(k);
        line.push('=');
        if v.is_empty() || v.contains([' ', '"', '=', '\n', '\r', '\\']) {
            line.push('"');
            for c in v.chars() {
                match c {
                    '"' => line.push_str("\\\""),
                    '\\' => line.push_str("\\\\"),
                    '\n' => line.push_str("\\n"),
                    '\r' => line.push_str("\\r"),
                    c => line.push(c),
                }
            }
            line.push('"');
        } else {
            line.push_str(v);
        }
    };
    put("time", &format_time(r.time_ms));
    put("type", "access");
    put("request_id", &r.request_id);
    put("listener", &r.listener);
    put("method", seen.method);
    put("path", seen.path);
    put(
        "client",
        &seen.client.map(|c| c.to_string()).unwrap_or_default(),
    );
    put("user_agent", seen.user_agent.unwrap_or_default());
    put("trace_id", &trace_hex(seen.trace_id));
    put("key_id", &r.key_id);
    put("endpoint", &r.endpoint);
    put("model", &r.model);
    put("served_model", &r.served_model);
    put("upstream", &r.upstream);
    put("status", &r.status.to_string());
    put("stream", if r.stream { "true" } else { "false" });
    put("prompt_tokens", &r.prompt_tokens.to_string());
    put("completion_tokens", &r.completion_tokens.to_string());
    put("total_tokens", &r.total_tokens.to_string());
    put("cost", &r.cost.to_string());
    put("latency_ms", &r.latency_ms.to_string());
    put(
        "ttft_ms",
        &r.ttft_ms.map(|t| t.to_string()).unwrap_or_default(),
    );
    put("attempts", &r.attempts.to_string());
    put("cut", &r.cut);
    line.push('\n');
    line
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn json_and_logfmt_lines_carry_the_record_and_escape_what_they_must() {
        let r = UsageRecord {
            time_ms: 1_795_353_265_123,
            request_id: "req_1".into(),
            key_id: "demo".into(),
            listener: "main".into(),
            endpoint: "chat".into(),
            model: "a \"quoted\" model=x".into(),
            status: 200,
            stream: false,
            prompt_tokens: 1,
            completion_tokens: 2,
            total_tokens: 3,
            cost: 0.5,
            latency_ms: 7,
            ttft_ms: None,
            upstream: "http://127.0.0.1:9100".into(),
            estimated: false,
            attempts: 1,
            served_model: "a".into(),
            cut: String::new(),
        };
        let seen = Seen {
            method: "POST",
            path: "/v1/chat/completions",
            client: "192.0.2.7".parse().ok(),
            user_agent: Some("OpenAI/Python 1.99.0"),
            trace_id: Some(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736),
        };
        let j: serde_json::Value = serde_json::from_str(&json_line(&r, &seen)).unwrap();
        assert_eq!(j["model"], "a \"quoted\" model=x");
        assert_eq!(j["status"], 200);
        assert_eq!(j["path"], "/v1/chat/completions");
        assert_eq!(j["client"], "192.0.2.7");
        assert_eq!(j["user_agent"], "OpenAI/Python 1.99.0");
        assert_eq!(j["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        let l = logfmt_line(&r, &seen);
        assert!(l.contains(r#" user_agent="OpenAI/Python 1.99.0" "#), "{l}");
        assert!(
            l.contains(" trace_id=4bf92f3577b34da6a3ce929d0e0e4736 "),
            "{l}"
        );
        assert!(l.contains(r#"model="a \"quoted\" model=x""#), "{l}");
        assert!(l.contains(" status=200 ") && l.ends_with('\n'), "{l}");
        assert!(l.contains(r#"ttft_ms="""#), "{l}");
    }
}
