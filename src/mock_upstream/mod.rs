//! Deterministic OpenAI-compatible stand-in model server (model `echo-1`) used by the demo,
//! the integration tests and the benches. Every reply is a pure function of the request, echo
//! headers (`x-mock-*`) expose what arrived, and `x-mock-*` request headers force edge cases.

// One request, top to bottom: `request` reads and decodes it, `replies` answers it (with
// `tokens` for the words and counts, `errors` for error bodies, `stream` for SSE events), and
// this file writes the answer back.
mod anthropic;
mod apis;
mod chat_turn;
mod errors;
mod replies;
mod request;
mod stream;
mod tokens;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::listening::Service;
use pingora_http::ResponseHeader;

use errors::{error_reply, forced_error};
use replies::{Reply, ReplyBody, delays_header, route};
use request::{
    Echo, MAX_BODY_BYTES, Overrides, Parsed, add_echo_headers, header_bytes, parse_body, read_body,
};
use stream::write_events;

pub use tokens::{REPLY_WORDS, reply_text};

/// Options of the mock server.
#[derive(Clone, Debug)]
pub struct MockOptions {
    /// Number of completion "tokens" per reply (and stream chunks carrying text).
    pub chunks: usize,
    /// Pause between streamed events, in milliseconds.
    pub delay_ms: u64,
    /// Serve HTTPS with this (certificate PEM path, private key PEM path).
    pub tls: Option<(String, String)>,
    /// Bind with `SO_REUSEPORT`: the port may be held (not listened on) by whoever picked it,
    /// as a test harness does for the gateway's in-process demo mock.
    pub reuse_port: bool,
}

impl Default for MockOptions {
    fn default() -> Self {
        MockOptions {
            chunks: 8,
            delay_ms: 0,
            tls: None,
            reuse_port: false,
        }
    }
}

/// The mock model server, a Pingora HTTP application.
pub struct MockUpstream {
    opts: MockOptions,
    /// `x-mock-fail-first`: how often each `x-request-id` has been seen (retries carry it).
    seen: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Stored responses of the Responses API.
    responses: apis::Stored,
    /// `x-mock-close-next: MS`: the client addresses (connections) whose next request is read
    /// and, MS milliseconds later, met with a close and no reply: with a small MS, an idle
    /// connection closed as a request came on it; with a large one, a server that fell over
    /// while working on the request.
    close_next: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl MockUpstream {
    pub fn new(opts: MockOptions) -> Self {
        MockUpstream {
            opts,
            seen: Default::default(),
            responses: Default::default(),
            close_next: Default::default(),
        }
    }

    /// The status to force on this request: `x-mock-status`, or with `x-mock-fail-first: N`
    /// that status (500 by default) only for the first N tries of one `x-request-id`.
    fn forced_status(&self, headers: &http::HeaderMap, status: Option<u16>) -> Option<u16> {
        let Some(n) = request::header_parse::<u32>(headers, "x-mock-fail-first") else {
            return status;
        };
        let id = String::from_utf8_lossy(header_bytes(headers, "x-request-id")).into_owned();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() > 100_000 {
            seen.clear();
        }
        let tries = seen.entry(id).or_insert(0);
        *tries += 1;
        (*tries <= n).then_some(status.unwrap_or(500))
    }
}

/// A listening service for `server.add_service(...)`.
pub fn service(listen: &str, opts: MockOptions) -> pingora_error::Result<Service<MockUpstream>> {
    let tls = opts.tls.clone();
    let opts_reuse_port = opts.reuse_port;
    let mut svc = Service::new("mock upstream".to_string(), MockUpstream::new(opts));
    match tls {
        Some((cert, key)) => svc.add_tls(listen, &cert, &key)?,
        None if opts_reuse_port => {
            let mut o = pingora_core::listeners::TcpSocketOptions::default();
            o.so_reuseport = Some(true);
            svc.add_tcp_with_settings(listen, o);
        }
        None => svc.add_tcp(listen),
    }
    Ok(svc)
}

/// Runs a standalone Pingora server with only the mock (for
/// `modelgate mock-upstream --listen ADDR`). Blocks forever.
///
/// Unlike Pingora's defaults (5 minute grace period), SIGTERM stops the mock within ~1 s.
pub fn run_standalone(listen: &str, opts: MockOptions, threads: usize) -> ! {
    let conf = ServerConf {
        threads,
        work_stealing: threads > 1,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    match service(listen, opts) {
        Ok(svc) => {
            server.add_service(svc);
        }
        Err(e) => {
            log::error!("mock upstream: cannot listen on {listen}: {e}");
            std::process::exit(2);
        }
    }
    log::info!("mock upstream listening on {listen}");
    server.run_forever()
}

impl MockUpstream {
    /// A connection that asked (`x-mock-close-next`) to be closed at its next request: after
    /// how many milliseconds; its next asks again, if it says so.
    fn close_asked(&self, addr: &str, session: &ServerSession) -> Option<u64> {
        let mut close_next = self.close_next.lock().unwrap_or_else(|e| e.into_inner());
        let close = close_next.remove(addr);
        let next = request::header_parse::<u64>(&session.req_header().headers, "x-mock-close-next");
        if let (None, Some(ms)) = (close, next) {
            close_next.insert(addr.to_string(), ms);
        }
        close
    }

    /// The reply to a request: what the overrides force, else the API's own.
    fn reply(
        &self,
        method: &http::Method,
        path: &str,
        parsed: &Parsed,
        overrides: &Overrides,
        model: &str,
        too_large: bool,
    ) -> Reply {
        if overrides.html {
            Reply {
                status: 200,
                content_type: "text/html; charset=utf-8",
                body: ReplyBody::Full(bytes::Bytes::from_static(
                    b"<html><body>Please sign in to continue.</body></html>",
                )),
            }
        } else if let Some(status) = overrides.status {
            let mut r = forced_error(status, path);
            if overrides.empty_body {
                r.body = ReplyBody::Full(bytes::Bytes::new());
            } else if overrides.text_body {
                r.content_type = "text/html";
                r.body = ReplyBody::Full(bytes::Bytes::from_static(
                    b"<html><body>502 Bad Gateway (nginx)</body></html>",
                ));
            }
            r
        } else if too_large {
            error_reply(
                413,
                "invalid_request_error",
                &format!("request body larger than {MAX_BODY_BYTES} bytes"),
                "body_too_large",
            )
        } else {
            apis::route(method, path, parsed, overrides, model, &self.responses)
                .unwrap_or_else(|| route(method, path, parsed, overrides, model))
        }
    }
}

#[async_trait]
impl HttpServerApp for MockUpstream {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        match session.read_request().await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                log::debug!("mock upstream: cannot read request: {e}");
                return None;
            }
        }
        let connection = session.client_addr().map(|a| a.to_string());
        if let Some(ms) = connection
            .as_deref()
            .and_then(|a| self.close_asked(a, &session))
        {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            return None;
        }
        let http10_close = {
            let req = session.req_header();
            req.version == http::Version::HTTP_10
                && !header_bytes(&req.headers, "connection").eq_ignore_ascii_case(b"keep-alive")
        };
        if *shutdown.borrow() || http10_close {
            session.set_keepalive(None);
        } else {
            session.set_keepalive(Some(60));
        }

        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        let mut overrides = Overrides::from_headers(&req.headers, &self.opts);
        overrides.status = self.forced_status(&req.headers, overrides.status);
        // What the reply echoes of the request (its body's figures and model added below).
        let mut echo = Echo::of_headers(&req.headers);
        echo.path = path.clone();
        echo.peer = connection.unwrap_or_default();
        let content_type =
            String::from_utf8_lossy(header_bytes(&req.headers, "content-type")).into_owned();
        let expect_continue =
            header_bytes(&req.headers, "expect").eq_ignore_ascii_case(b"100-continue");

        if expect_continue {
            if let Err(e) = session.write_continue_response().await {
                log::debug!("mock upstream: cannot write 100-continue: {e}");
                return None;
            }
        }

        let body = match read_body(&mut session).await {
            Ok(body) => body,
            Err(e) => {
                log::debug!("mock upstream: cannot read request body: {e}");
                return None;
            }
        };

        let parsed = if body.too_large {
            Parsed::Empty
        } else {
            parse_body(&content_type, body.data.clone()).await
        };
        if let Some(limit) = parsed
            .output_limit()
            .filter(|_| !overrides.ignore_max_tokens)
        {
            if limit < overrides.chunks {
                overrides.chunks = limit;
                overrides.length_limited = true;
            }
        }
        echo.model = parsed.model();
        echo.body_len = body.total_len;
        echo.body_sha256 = body.sha256_hex;
        echo.body = request::echo_body(&session.req_header().headers, &parsed);

        if overrides.garbage {
            write_garbage(&mut session, &echo, parsed.stream()).await;
            return None;
        }

        let reply = self.reply(
            &method,
            &path,
            &parsed,
            &overrides,
            &echo.model,
            body.too_large,
        );

        // A non-streamed reply waits `delay_ms` before its header (a slow model); a stream
        // waits between its events instead.
        if delays_header(&reply) && overrides.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(overrides.delay_ms)).await;
        }
        if let Err(e) = write_reply(&mut session, reply, &echo, &overrides).await {
            log::debug!("mock upstream: cannot write the reply: {e}");
            return None;
        }

        let settings = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
            Ok(Some(stream)) => Some(ReusedHttpStream::from_reusable_stream(stream, settings)),
            Ok(None) => None,
            Err(e) => {
                log::debug!("mock upstream: cannot finish the session: {e}");
                None
            }
        }
    }
}

async fn write_reply(
    session: &mut ServerSession,
    reply: Reply,
    echo: &Echo,
    ov: &Overrides,
) -> pingora_error::Result<()> {
    if let Some(status) = ov.informational {
        let mut info = ResponseHeader::build(status, Some(1))?;
        info.insert_header("link", "</style.css>; rel=preload")?;
        session.write_response_header(Box::new(info)).await?;
        if status == 101 {
            session.set_keepalive(None);
            return Ok(());
        }
    }
    let mut header = ResponseHeader::build(reply.status, Some(12))?;
    header.insert_header("content-type", reply.content_type)?;
    if let (Some(secs), true) = (ov.retry_after, reply.status >= 400) {
        header.insert_header("retry-after", secs.to_string())?;
    }
    add_echo_headers(&mut header, echo)?;
    if ov.provider_headers {
        request::add_provider_headers(&mut header)?;
    }
    if let Some(id) = &ov.echoed_request_id {
        header.insert_header("x-request-id", id.clone())?;
    }
    let mut body = reply.body;
    if reply.status == 200 {
        if let (ReplyBody::Full(full), Some(n)) = (&body, ov.pad_bytes) {
            body = ReplyBody::Full(padded(full, n));
        }
        if ov.gzip {
            header.insert_header("content-encoding", "gzip")?;
            body = gzipped(body);
        }
    }
    match body {
        ReplyBody::Full(body) if ov.body_delay_ms > 0 && body.len() > 1 => {
            // Chunked, so that the header and the first byte go out (a chunk is flushed; a
            // header before a body with a length is not).
            header.insert_header("transfer-encoding", "chunked")?;
            session.write_response_header(Box::new(header)).await?;
            session.write_response_body(body.slice(..1), false).await?;
            tokio::time::sleep(Duration::from_millis(ov.body_delay_ms)).await;
            session.write_response_body(body.slice(1..), true).await?;
        }
        ReplyBody::Full(body) => {
            header.insert_header("content-length", body.len().to_string())?;
            session.write_response_header(Box::new(header)).await?;
            if !body.is_empty() {
                session.write_response_body(body, true).await?;
            }
        }
        ReplyBody::Events(events) => {
            header.insert_header("cache-control", "no-cache")?;
            if ov.close_delimited {
                session.set_keepalive(None);
            } else {
                header.insert_header("transfer-encoding", "chunked")?;
            }
            session.write_response_header(Box::new(header)).await?;
            write_events(session, events, ov).await?;
        }
    }
    Ok(())
}

/// A JSON reply with a `padding` string making it about `n` bytes (keys stay in order, so
/// `usage` is still last).
fn padded(body: &bytes::Bytes, n: usize) -> bytes::Bytes {
    let Ok(serde_json::Value::Object(mut reply)) = serde_json::from_slice(body) else {
        return body.clone();
    };
    let pad = n.saturating_sub(body.len() + 16);
    reply.insert("padding".into(), serde_json::Value::String("x".repeat(pad)));
    bytes::Bytes::from(serde_json::Value::Object(reply).to_string())
}

/// The body gzip-compressed; a stream's events as one gzip stream sent in a few pieces.
fn gzipped(body: ReplyBody) -> ReplyBody {
    use std::io::Write;
    let gzip = |parts: &[bytes::Bytes]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for p in parts {
            let _ = e.write_all(p);
        }
        e.finish().unwrap_or_default()
    };
    match body {
        ReplyBody::Full(b) => ReplyBody::Full(bytes::Bytes::from(gzip(&[b]))),
        ReplyBody::Events(events) => {
            let all = gzip(&events);
            let piece = all.len().div_ceil(4).max(1);
            ReplyBody::Events(
                all.chunks(piece)
                    .map(bytes::Bytes::copy_from_slice)
                    .collect(),
            )
        }
    }
}

/// `x-mock-garbage`: announce 100 bytes, send 10, then close the connection (as a stream's
/// reply, `text/event-stream`, when one was asked for).
async fn write_garbage(session: &mut ServerSession, echo: &Echo, stream: bool) {
    session.set_keepalive(None);
    let result: pingora_error::Result<()> = async {
        let mut header = ResponseHeader::build(200, Some(8))?;
        let content_type = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        header.insert_header("content-type", content_type)?;
        header.insert_header("content-length", "100")?;
        add_echo_headers(&mut header, echo)?;
        session.write_response_header(Box::new(header)).await?;
        session
            .write_response_body(Bytes::from_static(b"{\"partial\""), false)
            .await?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        log::debug!("mock upstream: garbage reply failed early: {e}");
    }
    // Flushes what was buffered, then closes the write side.
    session.shutdown().await;
}
