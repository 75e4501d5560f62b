//! SSE passes through chunk by chunk, events split at any byte arrive intact, `[DONE]` ends it.

mod common;

use common::*;
use futures_util::StreamExt;
use std::time::Duration;

/// Reads an SSE body and returns the `data:` payloads in order.
fn events(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("utf-8 stream");
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

fn content_of(events: &[String]) -> String {
    events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<serde_json::Value>(e).expect("json event"))
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

async fn stream_with_split(base: &str, split: usize) -> (reqwest::header::HeaderMap, Vec<u8>) {
    let split = split.to_string();
    let resp = send(
        base,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", true),
        &[("x-mock-split", &split)],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let headers = resp.headers().clone();
    (headers, resp.bytes().await.expect("body").to_vec())
}

#[tokio::test]
async fn events_split_at_awkward_offsets_arrive_intact_on_both_listeners() {
    let g = start();
    for base in g.bases() {
        // 1 byte splits every multi-byte character; 7 and 13 land at arbitrary places.
        for split in [1, 2, 7, 13, 64] {
            let (headers, body) = stream_with_split(&base, split).await;
            assert!(
                headers["content-type"]
                    .to_str()
                    .expect("ct")
                    .starts_with("text/event-stream")
            );
            assert!(headers.contains_key("x-request-id"));
            let ev = events(&body);
            assert_eq!(
                ev.last().map(String::as_str),
                Some("[DONE]"),
                "split {split}"
            );
            assert_eq!(content_of(&ev), MOCK_TEXT, "split {split}");
            let before_done: serde_json::Value =
                serde_json::from_str(&ev[ev.len() - 2]).expect("json");
            assert_eq!(before_done["choices"][0]["finish_reason"], "stop");
        }
    }
}

#[tokio::test]
async fn the_stream_is_byte_identical_to_the_upstreams() {
    let g = start();
    let direct_from_mock = send(
        &g.mock,
        "/v1/chat/completions",
        None,
        &chat_body("echo-1", true),
        &[("x-mock-split", "5")],
    )
    .await
    .bytes()
    .await
    .expect("body");
    let (_, through) = stream_with_split(&g.main, 5).await;
    // Only the id's counter and `created` may differ between two runs: mask the digits.
    let mask = |b: &[u8]| {
        String::from_utf8(b.to_vec())
            .expect("utf-8")
            .replace(|c: char| c.is_ascii_digit(), "")
    };
    assert_eq!(mask(&through), mask(&direct_from_mock));
}

#[tokio::test]
async fn the_first_event_reaches_the_client_before_the_upstream_finishes() {
    let g = start();
    // 6 content events, 150 ms apart: the whole reply takes about a second.
    let resp = send(
        &g.direct,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", true),
        &[("x-mock-chunks", "6"), ("x-mock-delay-ms", "150")],
    )
    .await;
    let mut body = resp.bytes_stream();
    let first = body.next().await.expect("a first piece").expect("ok");
    let text = String::from_utf8_lossy(&first).to_string();
    assert!(text.starts_with("data: "), "{text}");
    // The reply is not complete when its first piece arrives: it was not buffered whole.
    assert!(
        !text.contains("[DONE]"),
        "the whole stream arrived at once: {text}"
    );
    let mut rest = Vec::new();
    while let Some(piece) = body.next().await {
        rest.extend_from_slice(&piece.expect("piece"));
    }
    assert!(String::from_utf8_lossy(&rest).contains("data: [DONE]"));
}

#[tokio::test]
async fn include_usage_is_passed_through_when_the_client_asks() {
    let g = start();
    let mut body = chat_body("echo-1", true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let resp = post_json(&g.main, "/v1/chat/completions", &body).await;
    let ev = events(&resp.bytes().await.expect("body"));
    let usage: serde_json::Value = serde_json::from_str(&ev[ev.len() - 2]).expect("json");
    assert_eq!(usage["usage"]["completion_tokens"], 8, "{usage}");
}

/// Real OpenAI-compatible servers put the usage the gateway asks for in different places
/// (`x-mock-usage-shape`). Whatever the shape and wherever the events split, the record has
/// the upstream's exact counts and a client that did not ask for usage never sees any.
#[tokio::test]
async fn usage_in_every_server_shape_is_metered_and_hidden_from_a_client_that_did_not_ask() {
    let g = start();
    let completion_body =
        serde_json::json!({"model": "echo-1", "stream": true, "prompt": "say hello to me"});
    for shape in [
        "empty-delta",
        "on-last",
        "on-last,no-done",
        "null-always",
        "empty-delta,no-done",
    ] {
        for (path, body) in [
            ("/v1/chat/completions", chat_body("echo-1", true)),
            ("/v1/completions", completion_body.clone()),
        ] {
            // What the upstream itself reports when asked.
            let mut asked = body.clone();
            asked["stream_options"] = serde_json::json!({"include_usage": true});
            let raw = send(
                &g.mock,
                path,
                None,
                &asked,
                &[("x-mock-usage-shape", shape)],
            )
            .await
            .bytes()
            .await
            .expect("body");
            let prompt = events(&raw)
                .iter()
                .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
                .find_map(|v| v["usage"]["prompt_tokens"].as_u64())
                .expect("the mock reports usage when asked");
            for split in ["5", "64"] {
                let resp = send(
                    &g.main,
                    path,
                    Some(KEY),
                    &body,
                    &[("x-mock-usage-shape", shape), ("x-mock-split", split)],
                )
                .await;
                assert_eq!(resp.status(), 200);
                let id = request_id(&resp);
                let bytes = resp.bytes().await.expect("body");
                let text = String::from_utf8_lossy(&bytes);
                let at = format!("{path} shape {shape} split {split}");
                assert!(!text.contains("usage"), "{at}: {text}");
                // A stream the upstream ended whole ends with `[DONE]` (the API's terminator),
                // the gateway's when the upstream sent none; and only one.
                assert!(text.ends_with("data: [DONE]\n\n"), "{at}: {text}");
                assert_eq!(text.matches("[DONE]").count(), 1, "{at}");
                let ev = events(&bytes);
                let finish = ev
                    .iter()
                    .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
                    .filter(|v| v["choices"][0]["finish_reason"] == "stop")
                    .count();
                assert_eq!(finish, 1, "{at}: the final event stays");
                let record = await_record(&g, &id).await;
                assert_eq!(record["prompt_tokens"], prompt, "{at}: {record}");
                assert_eq!(record["completion_tokens"], 8, "{at}: {record}");
                assert_eq!(record["estimated"], false, "{at}");
            }
            // A client that asks gets the usage as the upstream sent it.
            let resp = send(
                &g.main,
                path,
                Some(KEY),
                &asked,
                &[("x-mock-usage-shape", shape)],
            )
            .await;
            let text = resp.text().await.expect("body");
            assert!(
                text.contains("\"completion_tokens\":8"),
                "{path} {shape}: {text}"
            );
        }
    }
}

/// The gateway ends a chat stream with `[DONE]` only when the upstream's end is known to be
/// its end: a stream ended by the upstream closing its connection (no length, no chunks) may
/// have been cut, so it gets none (and the client's copy ends as the upstream's did).
#[tokio::test]
async fn a_close_delimited_stream_gets_no_done_of_the_gateways() {
    let g = start();
    for (headers, done) in [
        (vec![("x-mock-usage-shape", "no-done")], true),
        (
            vec![
                ("x-mock-usage-shape", "no-done"),
                ("x-mock-close-delimited", "1"),
            ],
            false,
        ),
    ] {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body("echo-1", true),
            &headers,
        )
        .await;
        assert_eq!(resp.status(), 200);
        let text = String::from_utf8_lossy(&resp.bytes().await.unwrap_or_default()).into_owned();
        assert!(text.contains("Hello"), "{text}");
        assert_eq!(text.contains("[DONE]"), done, "{headers:?}: {text}");
    }
}

/// A stream's reply is written on the client's connection itself once the stream is admitted
/// (Pingora's session is given up): it carries what the session's would (`Date`, `Connection`
/// as the connection goes on), goes chunked to an HTTP/1.1 client, which keeps its connection,
/// and to the close to an HTTP/1.0 one, whether or not the upstream's reply had a known end.
#[tokio::test]
async fn a_streams_reply_is_framed_for_its_clients_version() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start();
    let body = chat_body("echo-1", true).to_string();
    for (version, extra, close_delimited) in [
        ("HTTP/1.0", "", false),
        ("HTTP/1.0", "x-mock-close-delimited: 1\r\n", true),
        ("HTTP/1.1", "Connection: close\r\n", false),
    ] {
        let mut s = raw_connect(&g.main).await;
        // The upstream sends no `[DONE]`: the gateway's ends a stream whose end is known.
        let extra = format!("x-mock-usage-shape: no-done\r\n{extra}");
        let head = chat_head(KEY, body.len(), &extra).replacen("HTTP/1.1", version, 1);
        s.write_all(format!("{head}{body}").as_bytes())
            .await
            .expect("write");
        // Each ends with the close: HTTP/1.0 knows no chunks, and the last asked for it.
        let mut raw = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await;
        read.expect("the reply ends with the close").expect("read");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (header, rest) = text.split_once("\r\n\r\n").expect("a header");
        let header = header.to_ascii_lowercase();
        assert!(header.starts_with("http/1.1 200"), "{header}");
        assert!(header.contains("\r\ndate: "), "{header}");
        assert!(header.contains("\r\nconnection: close"), "{header}");
        assert_eq!(
            header.contains("transfer-encoding: chunked"),
            version == "HTTP/1.1"
        );
        assert!(rest.contains("Hello"), "{version} {extra}: {rest}");
        assert_eq!(rest.contains("[DONE]"), !close_delimited, "{rest}");
        if version == "HTTP/1.1" {
            assert!(rest.ends_with("0\r\n\r\n"), "{rest}");
        } else {
            assert!(rest.trim_end().ends_with("}") || rest.trim_end().ends_with("[DONE]"));
        }
        let record = await_record(&g, &request_id_in(&text)).await;
        assert_eq!(record["status"], 200, "{record}");
    }
    // Kept alive: a stream's reply, then the next request's on the same connection.
    let mut s = raw_connect(&g.main).await;
    let head = chat_head(KEY, body.len(), "");
    s.write_all(format!("{head}{body}").as_bytes())
        .await
        .expect("write");
    let raw = read_raw_until(&mut s, Duration::from_secs(10), |r| {
        r.ends_with(b"0\r\n\r\n")
    })
    .await;
    let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(text.contains("\r\nconnection: keep-alive\r\n"), "{text}");
    let models =
        format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    s.write_all(models.as_bytes()).await.expect("write");
    let mut buf = [0u8; 65536];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("the next reply")
        .expect("read");
    let next = String::from_utf8_lossy(&buf[..n]);
    assert!(next.starts_with("HTTP/1.1 200"), "{next}");
}
