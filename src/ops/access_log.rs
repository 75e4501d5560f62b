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

/// The writer thread writes what is pending this often.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// A line that brings the pending lines past this wakes the writer at once.
const WAKE_BYTES: usize = 256 * 1024;
/// Lines pending past this are dropped (and counted), never blocking a request.
const MAX_PENDING: usize = 16 * 1024 * 1024;
/// How often a file's path is checked for a rename.
const CHECK_EVERY: Duration = Duration::from_secs(1);

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

    /// Whether this request is logged (`[log] access` as a sample rate).
    pub fn sampled(&self) -> bool {
        self.rate >= 1.0 || rand::random::<f64>() < self.rate
    }

    /// Logs a request's line (once `sampled` said so).
    pub fn log(&self, line: &Line<'_>) {
        LINE.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            match self.format {
                Format::Json => json_line(&mut buf, line),
                Format::Logfmt => logfmt_line(&mut buf, line),
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

/// A request's line: its usage record's fields and what the record does not hold (method,
/// path, client address, user agent, trace id, the upstream's request id), borrowed, in the
/// order written.
#[derive(Debug, Default, Serialize)]
pub struct Line<'a> {
    /// RFC 3339, milliseconds, UTC.
    pub time: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub request_id: &'a str,
    pub listener: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    /// The client's address (the one `[server] trusted_proxies` name, behind them).
    pub client: Option<std::net::IpAddr>,
    pub user_agent: Option<&'a str>,
    /// The W3C trace id (32 hex digits) the request was traced under.
    pub trace_id: Option<String>,
    pub key_id: &'a str,
    pub endpoint: &'a str,
    pub model: &'a str,
    pub served_model: &'a str,
    pub upstream: &'a str,
    /// The request id the upstream gave its reply (`x-upstream-request-id` to the client).
    pub upstream_request_id: Option<&'a str>,
    pub status: u16,
    pub stream: bool,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub cost: f64,
    pub latency_ms: u64,
    pub ttft_ms: Option<u64>,
    pub attempts: u32,
    pub cut: &'a str,
}

fn json_line(out: &mut Vec<u8>, line: &Line<'_>) {
    // (Plain fields always encode.)
    let _ = serde_json::to_writer(&mut *out, line);
    out.push(b'\n');
}

/// `key=value` pairs; a value with a space, quote or `=` is quoted with `"` escaped.
fn logfmt_line(out: &mut Vec<u8>, l: &Line<'_>) {
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
    put("time", &l.time);
    put("type", "access");
    put("request_id", l.request_id);
    put("listener", l.listener);
    put("method", l.method);
    put("path", l.path);
    put(
        "client",
        &l.client.map(|c| c.to_string()).unwrap_or_default(),
    );
    put("user_agent", l.user_agent.unwrap_or_default());
    put("trace_id", l.trace_id.as_deref().unwrap_or_default());
    put("key_id", l.key_id);
    put("endpoint", l.endpoint);
    put("model", l.model);
    put("served_model", l.served_model);
    put("upstream", l.upstream);
    put(
        "upstream_request_id",
        l.upstream_request_id.unwrap_or_default(),
    );
    put("status", &l.status.to_string());
    put("stream", if l.stream { "true" } else { "false" });
    put("prompt_tokens", &l.prompt_tokens.to_string());
    put("completion_tokens", &l.completion_tokens.to_string());
    put("total_tokens", &l.total_tokens.to_string());
    put("cost", &l.cost.to_string());
    put("latency_ms", &l.latency_ms.to_string());
    put(
        "ttft_ms",
        &l.ttft_ms.map(|t| t.to_string()).unwrap_or_default(),
    );
    put("attempts", &l.attempts.to_string());
    put("cut", l.cut);
    line.push('\n');
    out.extend_from_slice(line.as_bytes());
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn json_and_logfmt_lines_carry_the_record_and_escape_what_they_must() {
        let l = Line {
            time: "2026-11-20T03:14:25.123Z".into(),
            kind: "access",
            request_id: "req_1",
            listener: "main",
            method: "POST",
            path: "/v1/chat/completions",
            client: "192.0.2.7".parse().ok(),
            user_agent: Some("OpenAI/Python 1.99.0"),
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            key_id: "demo",
            endpoint: "chat",
            model: "a \"quoted\" model=x",
            served_model: "a",
            upstream: "http://127.0.0.1:9100",
            upstream_request_id: Some("chatcmpl-up 1"),
            status: 200,
            prompt_tokens: 1,
            completion_tokens: 2,
            total_tokens: 3,
            cost: 0.5,
            latency_ms: 7,
            attempts: 1,
            ..Line::default()
        };
        let mut line = Vec::new();
        json_line(&mut line, &l);
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
        let mut text = Vec::new();
        logfmt_line(&mut text, &l);
        let l = String::from_utf8(text).unwrap();
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
