//! The access log: one structured line per request on stderr (JSON, or logfmt), made from the
//! request's usage record plus what the record does not hold (method, path, attempts are in
//! it). Lines are formatted on the request's thread and written by one background thread
//! through a buffer flushed whenever the queue runs dry, so a request never waits on stderr.
//! `[log] access = "on" | "off" | <sample rate in 0..1>`; secrets never appear (the record
//! holds the key's id, never the key).

use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use crate::store::UsageRecord;
use crate::store::record::format_time;

/// Lines queued for the writer; past this they are dropped (and counted), never blocking.
const QUEUE: usize = 65_536;

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
    /// Starts the writer thread; None when the log is off.
    pub fn start(rate: f64, format: Format) -> Option<AccessLog> {
        if rate <= 0.0 {
            return None;
        }
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(rx))
            .ok()?;
        Some(AccessLog {
            tx,
            rate: rate.min(1.0),
            format,
            dropped: Default::default(),
        })
    }

    /// Logs the request, if sampled.
    pub fn log(&self, r: &UsageRecord, method: &str, path: &str) {
        if self.rate < 1.0 && rand::random::<f64>() >= self.rate {
            return;
        }
        let line = match self.format {
            Format::Json => json_line(r, method, path),
            Format::Logfmt => logfmt_line(r, method, path),
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send(line) {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

fn write_lines(rx: Receiver<String>) {
    // Not `stderr().lock()`: a lock held while waiting for lines would block every other
    // writer of stderr (the tracing log) for good. The buffer locks it once per flush.
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stderr());
    while let Ok(line) = rx.recv() {
        let _ = out.write_all(line.as_bytes());
        // Write what else is queued, then flush once the queue is empty.
        while let Ok(more) = rx.try_recv() {
            let _ = out.write_all(more.as_bytes());
        }
        let _ = out.flush();
    }
}

fn json_line(r: &UsageRecord, method: &str, path: &str) -> String {
    let mut line = serde_json::json!({
        "time": format_time(r.time_ms),
        "type": "access",
        "request_id": r.request_id,
        "listener": r.listener,
        "method": method,
        "path": path,
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
fn logfmt_line(r: &UsageRecord, method: &str, path: &str) -> String {
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
    put("method", method);
    put("path", path);
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
        let j: serde_json::Value =
            serde_json::from_str(&json_line(&r, "POST", "/v1/chat/completions")).unwrap();
        assert_eq!(j["model"], "a \"quoted\" model=x");
        assert_eq!(j["status"], 200);
        assert_eq!(j["path"], "/v1/chat/completions");
        let l = logfmt_line(&r, "POST", "/v1/chat/completions");
        assert!(l.contains(r#"model="a \"quoted\" model=x""#), "{l}");
        assert!(l.contains(" status=200 ") && l.ends_with('\n'), "{l}");
        assert!(l.contains(r#"ttft_ms="""#), "{l}");
    }
}
