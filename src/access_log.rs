//! The access log: one structured line per request (JSON, or logfmt) on stdout, apart from the
//! gateway's own log on stderr (so `jq` reads it whole), or appended to `[log] access_file`;
//! made from the request's usage record plus what the record does not hold (method, path,
//! client address, user agent, trace id, the upstream's own request id). A line is encoded on
//! the request's thread, straight into a buffer of its own, and added to the lines pending;
//! one background thread writes what is pending every `FLUSH_EVERY` (sooner past `WAKE_BYTES`),
//! so no line wakes anything and a request never waits on the output. A file is reopened when
//! it was renamed or removed (logrotate's default) and on SIGUSR1. `[log] access = "on" | "off"
//! | <sample rate in 0..1>`; secrets never appear (the record holds the key's id, never the
//! key).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::store::UsageRecord;
use crate::store::record::format_time;

/// The writer thread writes what is pending this often.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// A line that brings the pending lines past this wakes the writer at once.
const WAKE_BYTES: usize = 256 * 1024;
/// Lines pending past this are dropped (and counted), never blocking a request.
const MAX_PENDING: usize = 16 * 1024 * 1024;
/// How often a file's path is checked for a rename.
const CHECK_EVERY: Duration = Duration::from_secs(1);

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
    /// The request id the upstream gave its reply (`x-upstream-request-id` to the client).
    pub upstream_request_id: Option<&'a str>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    Json,
    Logfmt,
}

/// Where lines go.
enum Out {
    Stdout,
    File { file: File, path: PathBuf },
}

impl Out {
    fn open(path: &Path) -> std::io::Result<Out> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Out::File {
            file,
            path: path.to_path_buf(),
        })
    }

    fn write(&mut self, lines: &[u8]) -> std::io::Result<()> {
        match self {
            // Locked per write, never held while waiting: other writers of stdout go on.
            Out::Stdout => std::io::stdout().lock().write_all(lines),
            Out::File { file, .. } => file.write_all(lines),
        }
    }

    /// Opens the file again when `forced` (SIGUSR1) or when its path names another file or
    /// none (renamed away by logrotate): lines go to the file now at the path.
    fn reopen_if_moved(&mut self, forced: bool) {
        let Out::File { file, path } = self else {
            return;
        };
        use std::os::unix::fs::MetadataExt;
        let same = match (file.metadata(), std::fs::metadata(&*path)) {
            (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
            _ => false,
        };
        if same && !forced {
            return;
        }
        match Out::open(path) {
            Ok(new) => *self = new,
            Err(e) => tracing::error!("access log: cannot reopen {}: {e}", path.display()),
        }
    }
}

struct Inner {
    pending: Mutex<Vec<u8>>,
    out: Mutex<Out>,
    /// Lines dropped because too many were pending (the output stalled).
    dropped: AtomicU64,
    /// Set by SIGUSR1: reopen the file.
    reopen: Arc<AtomicBool>,
    writer: OnceLock<std::thread::Thread>,
}

impl Inner {
    /// Writes what is pending; `spare` is the buffer taken in its place.
    fn write_pending(&self, spare: &mut Vec<u8>) {
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.is_empty() {
                return;
            }
            std::mem::swap(&mut *p, spare);
        }
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = out.write(spare) {
            tracing::error!("access log: cannot write: {e}");
        }
        drop(out);
        spare.clear();
        if spare.capacity() > 4 * WAKE_BYTES {
            *spare = Vec::new();
        }
    }

    fn run(&self) {
        let mut spare = Vec::new();
        let mut checked = Instant::now();
        loop {
            std::thread::park_timeout(FLUSH_EVERY);
            self.write_pending(&mut spare);
            let forced = self.reopen.swap(false, Ordering::Relaxed);
            if forced || checked.elapsed() >= CHECK_EVERY {
                checked = Instant::now();
                self.out
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .reopen_if_moved(forced);
            }
        }
    }
}

thread_local! {
    /// Each thread encodes its lines here before adding them.
    static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The access log; clones share it.
#[derive(Clone)]
pub struct AccessLog {
    inner: Arc<Inner>,
    /// Share of requests logged (1.0: every one).
    rate: f64,
    format: Format,
}

impl AccessLog {
    /// Starts the writer thread, to `file` (appended) or stdout; None when the log is off.
    pub fn start(rate: f64, format: Format, file: Option<&Path>) -> Option<AccessLog> {
        if rate <= 0.0 {
            return None;
        }
        let out = match file {
            Some(path) => Out::open(path).unwrap_or_else(|e| {
                tracing::error!(
                    "access log: cannot open {}: {e}; writing to stdout",
                    path.display()
                );
                Out::Stdout
            }),
            None => Out::Stdout,
        };
        let reopen = Arc::new(AtomicBool::new(false));
        // SIGUSR1 (whose default would end the process) asks for the file to be reopened.
        if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGUSR1, reopen.clone()) {
            tracing::warn!("access log: cannot listen for SIGUSR1: {e}");
        }
        let inner = Arc::new(Inner {
            pending: Mutex::new(Vec::with_capacity(WAKE_BYTES)),
            out: Mutex::new(out),
            dropped: AtomicU64::new(0),
            reopen,
            writer: OnceLock::new(),
        });
        let run = inner.clone();
        let handle = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || run.run())
            .ok()?;
        let _ = inner.writer.set(handle.thread().clone());
        Some(AccessLog {
            inner,
            rate: rate.min(1.0),
            format,
        })
    }

    /// Logs the request, if sampled.
    pub fn log(&self, r: &UsageRecord, seen: &Seen<'_>) {
        if self.rate < 1.0 && rand::random::<f64>() >= self.rate {
            return;
        }
        LINE.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            match self.format {
                Format::Json => json_line(&mut buf, r, seen),
                Format::Logfmt => logfmt_line(&mut buf, r, seen),
            }
            let mut p = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() + buf.len() > MAX_PENDING {
                drop(p);
                self.inner.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let before = p.len();
            p.extend_from_slice(&buf);
            let wake = before < WAKE_BYTES && p.len() >= WAKE_BYTES;
            drop(p);
            if wake && let Some(t) = self.inner.writer.get() {
                t.unpark();
            }
            if buf.capacity() > 64 * 1024 {
                *buf = Vec::new();
            }
        });
    }

    /// Writes every pending line now (at exit).
    pub fn flush(&self) {
        self.inner.write_pending(&mut Vec::new());
    }

    /// Lines dropped because the output could not keep up.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }
}

fn trace_hex(id: Option<u128>) -> String {
    id.map(|t| format!("{t:032x}")).unwrap_or_default()
}

/// A JSON line's fields, borrowed from the record, in the order written.
#[derive(Serialize)]
struct JsonLine<'a> {
    time: String,
    #[serde(rename = "type")]
    kind: &'static str,
    request_id: &'a str,
    listener: &'a str,
    method: &'a str,
    path: &'a str,
    client: Option<std::net::IpAddr>,
    user_agent: Option<&'a str>,
    trace_id: Option<String>,
    key_id: &'a str,
    endpoint: &'a str,
    model: &'a str,
    served_model: &'a str,
    upstream: &'a str,
    upstream_request_id: Option<&'a str>,
    status: u16,
    stream: bool,
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    cost: f64,
    latency_ms: u64,
    ttft_ms: Option<u64>,
    attempts: u32,
    cut: &'a str,
}

fn json_line(out: &mut Vec<u8>, r: &UsageRecord, seen: &Seen<'_>) {
    let line = JsonLine {
        time: format_time(r.time_ms),
        kind: "access",
        request_id: &r.request_id,
        listener: &r.listener,
        method: seen.method,
        path: seen.path,
        client: seen.client,
        user_agent: seen.user_agent,
        trace_id: seen.trace_id.map(|t| trace_hex(Some(t))),
        key_id: &r.key_id,
        endpoint: &r.endpoint,
        model: &r.model,
        served_model: &r.served_model,
        upstream: &r.upstream,
        upstream_request_id: seen.upstream_request_id,
        status: r.status,
        stream: r.stream,
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.completion_tokens,
        total_tokens: r.total_tokens,
        cost: r.cost,
        latency_ms: r.latency_ms,
        ttft_ms: r.ttft_ms,
        attempts: r.attempts,
        cut: &r.cut,
    };
    // (Plain fields always encode.)
    let _ = serde_json::to_writer(&mut *out, &line);
    out.push(b'\n');
}

/// `key=value` pairs; a value with a space, quote or `=` is quoted with `"` escaped.
fn logfmt_line(out: &mut Vec<u8>, r: &UsageRecord, seen: &Seen<'_>) {
    let mut line = String::with_capacity(512);
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
    put(
        "upstream_request_id",
        seen.upstream_request_id.unwrap_or_default(),
    );
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
    out.extend_from_slice(line.as_bytes());
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
            upstream_request_id: Some("chatcmpl-up 1"),
        };
        let mut line = Vec::new();
        json_line(&mut line, &r, &seen);
        let j: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(j["model"], "a \"quoted\" model=x");
        assert_eq!(j["status"], 200);
        assert_eq!(j["path"], "/v1/chat/completions");
        assert_eq!(j["client"], "192.0.2.7");
        assert_eq!(j["user_agent"], "OpenAI/Python 1.99.0");
        assert_eq!(j["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(j["upstream_request_id"], "chatcmpl-up 1");
        assert_eq!(j["ttft_ms"], serde_json::Value::Null);
        assert!(line.ends_with(b"}\n"));
        let mut l = Vec::new();
        logfmt_line(&mut l, &r, &seen);
        let l = String::from_utf8(l).unwrap();
        assert!(
            l.contains(r#" upstream_request_id="chatcmpl-up 1" "#),
            "{l}"
        );
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
