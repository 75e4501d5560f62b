//! W3C trace context through the gateway and OTLP/HTTP export, against a small OTLP receiver
//! started here (it decodes what the gateway's exporter sends with the OpenTelemetry protos).
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Spans received, with the service name of their resource.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf body, answered 200.
async fn receiver() -> (u16, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let got: Received = Arc::default();
    let spans = got.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let spans = spans.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request: its header, then Content-Length bytes of body.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 8192];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    assert!(head.starts_with("post /v1/traces "), "{head}");
                    assert!(
                        head.contains("content-type: application/x-protobuf"),
                        "{head}"
                    );
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .expect("content-length");
                    while buf.len() < head_end + len {
                        let mut chunk = [0u8; 8192];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buf.drain(..head_end + len).skip(head_end).collect();
                    let req = ExportTraceServiceRequest::decode(&body[..]).expect("protobuf");
                    for rs in req.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.name")
                            .and_then(|a| a.value.as_ref())
                            .map(|v| format!("{:?}", v.value))
                            .unwrap_or_default();
                        for ss in rs.scope_spans {
                            for span in ss.spans {
                                spans.lock().expect("lock").push((service.clone(), span));
                            }
                        }
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if s.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, got)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attr(span: &Span, key: &str) -> String {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .map(|v| format!("{:?}", v.value))
        .unwrap_or_default()
}

/// The spans of one trace, once `n` of them have arrived.
async fn spans_of(got: &Received, trace: &str, n: usize) -> Vec<Span> {
    eventually_async(
        Duration::from_secs(15),
        &format!("fewer than {n} spans of {trace}"),
        async || {
            let spans: Vec<Span> = got
                .lock()
                .expect("lock")
                .iter()
                .filter(|(_, s)| hex(&s.trace_id) == trace)
                .map(|(_, s)| s.clone())
                .collect();
            if spans.len() >= n {
                Ok(spans)
            } else {
                Err(format!("{} of {n} spans of {trace}", spans.len()))
            }
        },
    )
    .await
}

#[tokio::test]
async fn trace_context_reaches_the_upstream_and_spans_reach_the_collector() {
    let (otlp, got) = receiver().await;
    let g = start_with(Setup {
        extra_config: format!(
            r#"
[telemetry]
otlp_endpoint = "http://127.0.0.1:{otlp}"
service_name = "gateway-under-test"

[[pools]]
pass_headers = ["x-mock-*"]
name = "mixed"
upstreams = ["http://127.0.0.1:@DEAD@", "http://127.0.0.1:@MOCK@"]
health_interval_ms = 0
retry_base_ms = 10

[[models]]
name = "mixed-model"
pool = "mixed"
upstream_model = "echo-1"
"#
        ),
        env: vec![("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into())],
        ..Setup::default()
    });
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace}-{client_span}-01");

    // 1. The client's trace: its parent kept, a span of ours in between, tracestate passed.
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("mixed-model", false),
        &[("traceparent", &traceparent), ("tracestate", "vendor=abc")],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    let echoed = h["traceparent"].to_str().expect("ascii").to_string();
    let ours: Vec<&str> = echoed.split('-').collect();
    assert_eq!((ours[0], ours[1], ours[3]), ("00", trace, "01"), "{echoed}");
    assert_ne!(ours[2], client_span, "the gateway's own span");
    let upstream_saw = h["x-mock-traceparent"].to_str().expect("ascii").to_string();
    let up: Vec<&str> = upstream_saw.split('-').collect();
    assert_eq!(up[1], trace, "{upstream_saw}");
    assert!(
        up[2] != ours[2] && up[2] != client_span,
        "the try's own span: {upstream_saw}"
    );
    assert_eq!(h["x-mock-tracestate"], "vendor=abc");
    let request_id = h["x-request-id"].to_str().expect("ascii").to_string();

    // server + auth + 2 tries (the dead upstream, then the mock) + metering.
    let spans = spans_of(&got, trace, 5).await;
    let server = spans.iter().find(|s| s.kind == 2).expect("a server span");
    assert_eq!(hex(&server.span_id), ours[2]);
    assert_eq!(hex(&server.parent_span_id), client_span);
    assert_eq!(server.name, "POST /v1/chat/completions");
    assert!(
        attr(server, "modelgate.request_id").contains(&request_id),
        "{server:?}"
    );
    assert!(attr(server, "gen_ai.request.model").contains("mixed-model"));
    let children: Vec<&Span> = spans
        .iter()
        .filter(|s| s.span_id != server.span_id)
        .collect();
    assert_eq!(children.len(), 4, "{children:?}");
    assert!(children.iter().all(|s| s.parent_span_id == server.span_id));
    let mut names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["auth", "metering", "upstream", "upstream"]);
    let tries: Vec<&&Span> = children.iter().filter(|s| s.name == "upstream").collect();
    let answered = tries
        .iter()
        .find(|s| attr(s, "modelgate.outcome").contains("2xx"))
        .expect("the answered try");
    assert_eq!(
        hex(&answered.span_id),
        up[2],
        "the upstream's parent is that try's span"
    );
    assert!(
        tries
            .iter()
            .any(|s| attr(s, "modelgate.outcome").contains("error"))
    );
    let metering = children
        .iter()
        .find(|s| s.name == "metering")
        .expect("metering");
    assert!(
        attr(metering, "gen_ai.usage.output_tokens").contains('8'),
        "{metering:?}"
    );
    assert!(
        got.lock()
            .expect("lock")
            .iter()
            .all(|(svc, _)| svc.contains("gateway-under-test"))
    );
    assert!(server.start_time_unix_nano <= answered.start_time_unix_nano);
    assert!(server.end_time_unix_nano >= answered.end_time_unix_nano);

    // 2. No traceparent: a new trace, sampled, with a root span.
    let resp = post_json(
        &g.direct,
        "/v1/chat/completions",
        &chat_body("echo-1", false),
    )
    .await;
    let echoed = resp.headers()["traceparent"]
        .to_str()
        .expect("ascii")
        .to_string();
    let fresh = echoed.split('-').nth(1).expect("trace id").to_string();
    assert_ne!(fresh, trace);
    assert!(echoed.ends_with("-01"));
    let spans = spans_of(&got, &fresh, 4).await;
    let root = spans.iter().find(|s| s.kind == 2).expect("server span");
    assert!(root.parent_span_id.is_empty(), "a root span: {root:?}");

    // 3. A client that does not sample: propagated, never exported. Refusals carry it too.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some("sk-wrong"),
        &chat_body("echo-1", false),
        &[(
            "traceparent",
            &format!("00-{unsampled}-b7ad6b7169203331-00"),
        )],
    )
    .await;
    assert_eq!(resp.status(), 401);
    assert!(
        resp.headers()["traceparent"]
            .to_str()
            .expect("ascii")
            .starts_with(&format!("00-{unsampled}-"))
    );
    let resp = post_json(&g.main, "/v1/chat/completions", &chat_body("echo-1", false)).await;
    let last = resp.headers()["traceparent"]
        .to_str()
        .expect("ascii")
        .split('-')
        .nth(1)
        .expect("id")
        .to_string();
    spans_of(&got, &last, 4).await;
    assert!(
        got.lock()
            .expect("lock")
            .iter()
            .all(|(_, s)| hex(&s.trace_id) != unsampled)
    );
    // Counted as exported once the collector answered each batch.
    let received = got.lock().expect("lock").len() as f64;
    eventually_async(
        Duration::from_secs(10),
        "exported spans not counted",
        async || {
            let n = metric_value(&g, "modelgate_otlp_spans_exported_total").await;
            if n < received {
                Err(format!("{n} of {received}"))
            } else {
                Ok(())
            }
        },
    )
    .await;
    assert_eq!(
        metric_value(&g, "modelgate_otlp_spans_failed_total").await,
        0.0
    );
}

/// A collector that cannot be reached is said in the log, once however many batches fail (not
/// a line per batch), and its dropped spans are counted on `/metrics`; requests are served as
/// ever.
#[tokio::test]
async fn a_collector_that_is_down_is_logged_once_and_counted() {
    let g = start_with(Setup {
        extra_config: r#"
[telemetry]
otlp_endpoint = "http://127.0.0.1:@DEAD@"
"#
        .into(),
        env: vec![("OTEL_BSP_SCHEDULE_DELAY".into(), "20".into())],
        ..Setup::default()
    });
    // Three batches, each failed before the next request.
    let mut failed = 0.0;
    for _ in 0..3 {
        let body = chat_body("echo-1", false);
        let resp = send(&g.main, "/v1/chat/completions", Some(KEY), &body, &[]).await;
        assert_eq!(resp.status(), 200);
        failed = eventually_async(
            Duration::from_secs(10),
            "failed spans not counted",
            async || {
                let now = metric_value(&g, "modelgate_otlp_spans_failed_total").await;
                if now > failed {
                    Ok(now)
                } else {
                    Err(format!("{now}"))
                }
            },
        )
        .await;
    }
    assert_eq!(
        metric_value(&g, "modelgate_otlp_spans_exported_total").await,
        0.0
    );
    let log = g.stop_and_stderr();
    assert_eq!(log.matches("OTLP export failed").count(), 1, "{log}");
}

/// Spans that find the export queue full (a collector that takes a batch and never answers
/// holds the exporter) are dropped and counted on `/metrics`, not lost unseen; requests are
/// served as ever.
#[tokio::test]
async fn spans_that_find_the_export_queue_full_are_counted() {
    // A collector that accepts connections and answers nothing: the first batch's export
    // waits (the exporter's own timeout is 10 s), and the spans after it queue.
    let hold = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = hold.local_addr().expect("addr").port();
    let held: Arc<Mutex<Vec<tokio::net::TcpStream>>> = Arc::default();
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = hold.accept().await {
            keep.lock().expect("held").push(s);
        }
    });
    const QUEUE: usize = 8;
    let g = start_with(Setup {
        extra_config: format!("[telemetry]\notlp_endpoint = \"http://127.0.0.1:{port}\"\n"),
        env: vec![
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "20".into()),
            ("OTEL_BSP_MAX_QUEUE_SIZE".into(), QUEUE.to_string()),
        ],
        ..Setup::default()
    });
    // Four spans a request (the request, auth, the upstream try, metering).
    const REQUESTS: usize = 10;
    for _ in 0..REQUESTS {
        let body = chat_body("echo-1", false);
        let resp = send(&g.main, "/v1/chat/completions", Some(KEY), &body, &[]).await;
        assert_eq!(resp.status(), 200);
    }
    // At most one batch (no more than the queue) is with the exporter and a queue's worth
    // waits behind it: every other span was dropped, and counted (a request's spans go once
    // its record is made, just after its reply).
    let spans = 4 * REQUESTS;
    let deadline = Instant::now() + Duration::from_secs(5);
    let dropped = loop {
        let dropped = metric_value(&g, "modelgate_otlp_spans_dropped_total").await as usize;
        if dropped >= spans - 2 * QUEUE || Instant::now() > deadline {
            break dropped;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        dropped >= spans - 2 * QUEUE && dropped < spans,
        "{dropped} of {spans} spans counted as dropped"
    );
    assert_eq!(
        metric_value(&g, "modelgate_otlp_spans_exported_total").await,
        0.0
    );
    assert!(
        !held.lock().expect("held").is_empty(),
        "no export was tried"
    );
}
