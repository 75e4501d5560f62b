//! TLS on the `main` and `direct` listeners (`[listeners.tls.main]`, `[listeners.tls.direct]`):
//! HTTPS with HTTP/2 by ALPN beside HTTP/1.1, streaming over both, the pages and the console
//! (its cookie `Secure`), certificates reloaded when their files change without dropping a
//! connection, and a bad certificate refused (at start: exit 2 naming it; on reload: the one in
//! force stays). Clients trust only the test's own CA.

mod common;

use std::time::{Duration, Instant};

use common::pki::Pki;
use common::*;
use serde_json::{Value, json};

const CONSOLE_PW: &str = "tls console password";

fn tls_config(main: Option<&Pki>, direct: Option<&Pki>) -> String {
    let mut out = String::new();
    for (name, pki) in [("main", main), ("direct", direct)] {
        if let Some(p) = pki {
            out += &format!(
                "\n[listeners.tls.{name}]\ncert = \"{}\"\nkey = \"{}\"\n",
                p.path("cert.pem"),
                p.path("key.pem")
            );
        }
    }
    out
}

fn https(base: &str) -> String {
    base.replace("http://", "https://")
}

/// A client trusting only `pki`'s CA; `h1`: HTTP/1.1 only (else HTTP/2 is offered by ALPN).
fn tls_client(pki: &Pki, h1: bool) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(pki.ca_pem().as_bytes()).expect("ca");
    let mut b = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(30));
    if h1 {
        b = b.http1_only();
    }
    b.build().expect("client")
}

async fn chat(
    client: &reqwest::Client,
    base: &str,
    stream: bool,
) -> reqwest::Result<reqwest::Response> {
    client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&chat_body("echo-1", stream))
        .send()
        .await
}

#[tokio::test]
async fn both_listeners_speak_https_with_http2_and_http1_streaming_included() {
    let pki = Pki::new("listener test CA");
    let g = start_with(Setup {
        extra_config: tls_config(Some(&pki), Some(&pki))
            + "\n[console]\nuser = \"admin\"\npassword = \"env:MG_TLS_CONSOLE_PW\"\n",
        env: vec![("MG_TLS_CONSOLE_PW".into(), CONSOLE_PW.into())],
        ..Setup::default()
    });
    let (main, direct) = (https(&g.main), https(&g.direct));
    let h2 = tls_client(&pki, false);
    let h1 = tls_client(&pki, true);
    for base in [&main, &direct] {
        for (client, version) in [
            (&h2, reqwest::Version::HTTP_2),
            (&h1, reqwest::Version::HTTP_11),
        ] {
            let resp = chat(client, base, false).await.expect("plain chat");
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.version(), version, "{base}");
            let v: Value = resp.json().await.expect("json");
            assert_eq!(v["choices"][0]["message"]["content"], MOCK_TEXT);

            let resp = chat(client, base, true).await.expect("streamed chat");
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.version(), version);
            let id = request_id(&resp);
            let mut resp = resp;
            let mut text = String::new();
            while let Some(chunk) = resp.chunk().await.expect("chunk") {
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
            let content: String = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .filter_map(|v| {
                    v["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(String::from)
                })
                .collect();
            assert_eq!(content, MOCK_TEXT);
            let record = await_record_via(&h2, &direct, &id).await;
            assert_eq!(record["status"], 200);
            assert_eq!(record["completion_tokens"], 8);
        }
    }

    // An HTTP/2 stream the client resets mid-way (the connection stays up for others) is
    // recorded as 499 with the upstream's own usage (read on to its end: `on_client_gone =
    // "finish"`), and a request waiting for the upstream's first byte is also one record when
    // reset.
    let mut cut = h2
        .post(format!("{main}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-mock-chunks", "40")
        .header("x-mock-delay-ms", "50")
        .json(&chat_body("echo-1", true))
        .send()
        .await
        .expect("stream");
    assert_eq!(cut.version(), reqwest::Version::HTTP_2);
    let id = request_id(&cut);
    let mut seen = String::new();
    while !seen.contains("Hello") {
        let piece = cut.chunk().await.expect("chunk").expect("piece");
        seen.push_str(&String::from_utf8_lossy(&piece));
    }
    drop(cut);
    let r = await_record_via(&h2, &direct, &id).await;
    assert_eq!(r["status"], 499, "{r}");
    assert_eq!(r["estimated"], false, "{r}");
    assert!(r["completion_tokens"].as_u64() > Some(0), "{r}");

    // HEAD of the CSV export over HTTP/2: its header, no body.
    let head = h2
        .head(format!("{direct}/api/usage.csv"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("head");
    assert_eq!(
        (head.status().as_u16(), head.version()),
        (200, reqwest::Version::HTTP_2)
    );
    assert!(head.bytes().await.expect("no body").is_empty());

    // The pages: the usage-record page on `direct`, the console on `main`, whose session
    // cookie is Secure over TLS (and HttpOnly, SameSite as always).
    let page = h2.get(format!("{direct}/")).send().await.expect("page");
    assert_eq!(page.status(), 200);
    assert_eq!(page.version(), reqwest::Version::HTTP_2);
    // A browser's sign-in names the page's origin; HTTP/2 carries the host as :authority.
    let login = h2
        .post(format!("{main}/console/login"))
        .header("origin", &main)
        .json(&json!({"user": "admin", "password": CONSOLE_PW}))
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), 204);
    assert_eq!(login.version(), reqwest::Version::HTTP_2);
    let cookie = login.headers()["set-cookie"].to_str().expect("cookie");
    for part in ["; Secure", "; HttpOnly", "; SameSite=Strict"] {
        assert!(cookie.contains(part), "{part} missing: {cookie}");
    }

    // A plain-HTTP client on a TLS listener gets no HTTP answer, and a client that does not
    // trust the certificate cannot connect.
    let plain = client()
        .post(format!("{}/v1/chat/completions", g.main))
        .bearer_auth(KEY)
        .json(&chat_body("echo-1", false))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");
    let stranger = tls_client(&Pki::new("some other CA"), false);
    assert!(chat(&stranger, &main, false).await.is_err());
}

/// Replaces a file by rename, as certbot's symlink swap or an editor does: never half-written.
fn replace(path: &str, contents: &[u8]) {
    let tmp = format!("{path}.new");
    std::fs::write(&tmp, contents).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

async fn reloads(g: &Gateway, result: &str) -> u64 {
    let series =
        format!("modelgate_tls_certificate_reloads_total{{listener=\"main\",result=\"{result}\"}}");
    metric_value(g, &series).await as u64
}

async fn await_reloads(g: &Gateway, result: &str, n: u64) {
    common::eventually_async(
        Duration::from_secs(10),
        &format!("no {result} reload #{n} within 10 s"),
        async || {
            let got = reloads(g, result).await;
            if got < n {
                Err(format!("{got} reloads"))
            } else {
                Ok(())
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_renewed_certificate_is_used_at_once_without_dropping_connections_and_a_bad_one_is_refused()
 {
    // A slow upstream: a stream of 40 events 50 ms apart (2 s) runs across the reload.
    let slow = start_mock(&["--chunks", "40", "--delay-ms", "50"]);
    let old = Pki::new("old CA");
    let g = start_with(Setup {
        extra_config: tls_config(Some(&old), None)
            + &format!(
                "\n[[pools]]\nname = \"slow\"\nupstreams = [\"http://127.0.0.1:{}\"]\n\n\
                 [[models]]\nname = \"slow-model\"\npool = \"slow\"\nupstream_model = \"echo-1\"\n",
                slow.port
            ),
        ..Setup::default()
    });
    let main = https(&g.main);
    let expiry = "modelgate_tls_certificate_expiry_timestamp_seconds{listener=\"main\"}";
    let far = metric_value(&g, expiry).await;
    assert!(
        far > 4.0e9,
        "rcgen's default certificate expires far ahead: {far}"
    );
    let new = Pki::new("new CA");
    // The renewal is valid for 90 days.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    new.issue_until("", Some(now + 90 * 86_400));
    let (old_h2, old_h1, new_client) = (
        tls_client(&old, false),
        tls_client(&old, true),
        tls_client(&new, false),
    );
    assert!(chat(&new_client, &main, false).await.is_err());

    // Connections opened under the old certificate: a stream in progress (HTTP/2) and an idle
    // kept-alive HTTP/1.1 connection.
    let mut streaming = old_h2
        .post(format!("{main}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&chat_body("slow-model", true))
        .send()
        .await
        .expect("stream");
    assert_eq!(streaming.status(), 200);
    let first = streaming
        .chunk()
        .await
        .expect("chunk")
        .expect("first piece");
    assert!(!first.is_empty());
    assert_eq!(chat(&old_h1, &main, false).await.expect("h1").status(), 200);

    // Renewal: the new CA's certificate and key replace the files.
    replace(
        &old.path("cert.pem"),
        &std::fs::read(new.path("cert.pem")).expect("read"),
    );
    replace(
        &old.path("key.pem"),
        &std::fs::read(new.path("key.pem")).expect("read"),
    );
    await_reloads(&g, "ok", 1).await;
    assert_eq!(metric_value(&g, expiry).await, (now + 90 * 86_400) as f64);
    let resp = chat(&new_client, &main, false)
        .await
        .expect("new handshakes present the renewed certificate");
    assert_eq!(resp.status(), 200);

    // The connections of before are still up: the stream ends whole, the kept-alive
    // connection answers again (a new handshake would fail: the old CA no longer matches).
    let mut text = String::from_utf8_lossy(&first).into_owned();
    while let Some(chunk) = streaming.chunk().await.expect("stream survives the reload") {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // 40 pieces of text after the opening event, which has an empty content.
    assert_eq!(text.matches("\"content\"").count(), 41, "{text}");
    assert_eq!(
        chat(&old_h1, &main, false)
            .await
            .expect("kept-alive connection")
            .status(),
        200
    );
    assert!(chat(&tls_client(&old, true), &main, false).await.is_err());

    // Bad files: not PEM at all, then a certificate whose key is another's. Both are refused,
    // the renewed certificate stays in force, and the refusal is logged.
    replace(
        &old.path("cert.pem"),
        b"-----BEGIN CERTIFICATE-----\nnot base64!\n",
    );
    await_reloads(&g, "rejected", 1).await;
    assert_eq!(
        chat(&tls_client(&new, false), &main, false)
            .await
            .expect("still served")
            .status(),
        200
    );
    let third = Pki::new("third CA");
    let (other_cert, _) = third.issue("other-");
    replace(
        &old.path("cert.pem"),
        &std::fs::read(&other_cert).expect("read"),
    );
    await_reloads(&g, "rejected", 2).await;
    assert_eq!(
        chat(&tls_client(&new, false), &main, false)
            .await
            .expect("still served")
            .status(),
        200
    );
    // A certificate of the key in force, but expired: refused too.
    let (expired_cert, _) = new.reissue("expired-", &old.path("key.pem"), Some(now - 86_400));
    replace(
        &old.path("cert.pem"),
        &std::fs::read(&expired_cert).expect("read"),
    );
    await_reloads(&g, "rejected", 3).await;
    assert_eq!(
        chat(&tls_client(&new, false), &main, false)
            .await
            .expect("still served")
            .status(),
        200
    );
    assert_eq!(metric_value(&g, expiry).await, (now + 90 * 86_400) as f64);
    assert_eq!(reloads(&g, "ok").await, 1);
    let stderr = g.stop_and_stderr();
    assert!(
        stderr.contains("TLS certificate not reloaded, the one in force stays"),
        "{stderr}"
    );
    assert!(stderr.contains("has expired"), "{stderr}");
}

#[test]
fn a_listener_certificate_that_cannot_be_used_stops_the_start_naming_it() {
    let pki = Pki::new("start test CA");
    let another = Pki::new("another CA");
    let (other_cert, _) = another.issue("other-");
    let garbage = pki.path("garbage.pem");
    std::fs::write(&garbage, "hello").expect("write");
    let cases = [
        (
            format!(
                "[listeners.tls.main]\ncert = \"{other_cert}\"\nkey = \"{}\"\n",
                pki.path("key.pem")
            ),
            "do not make a usable pair",
        ),
        (
            format!(
                "[listeners.tls.main]\ncert = \"{garbage}\"\nkey = \"{}\"\n",
                pki.path("key.pem")
            ),
            "holds no certificate",
        ),
        (
            format!(
                "[listeners.tls.main]\ncert = \"{}\"\nkey = \"{garbage}\"\n",
                pki.path("cert.pem")
            ),
            "holds no PEM private key",
        ),
        (
            format!(
                "[listeners.tls.main]\ncert = \"{}/missing.pem\"\nkey = \"{}\"\n",
                pki.dir.path().display(),
                pki.path("key.pem")
            ),
            "cannot read",
        ),
        (
            format!(
                "[listeners.tls.admin]\ncert = \"{}\"\nkey = \"{}\"\n",
                pki.path("cert.pem"),
                pki.path("key.pem")
            ),
            "unknown field `admin`, expected `main` or `direct`",
        ),
    ];
    for (tls, expected) in cases {
        let dir = tempfile::tempdir().expect("tmp");
        let config = dir.path().join("modelgate.toml");
        std::fs::write(
            &config,
            format!(
                "[listeners]\nmain = \"127.0.0.1:{}\"\n\n[keys]\nfile = \"keys.toml\"\n\n{tls}",
                free_port()
            ),
        )
        .expect("write");
        std::fs::write(dir.path().join("keys.toml"), "").expect("write");
        for command in ["check", "serve"] {
            let out = std::process::Command::new(bin())
                .args([command, "--config"])
                .arg(&config)
                .output()
                .expect("run");
            let stderr = String::from_utf8_lossy(&out.stderr);
            let code = if command == "check" { 1 } else { 2 };
            assert_eq!(out.status.code(), Some(code), "{command}: {stderr}");
            assert!(
                stderr.contains("listeners.tls") || expected.contains("admin"),
                "{command}: {stderr}"
            );
            assert!(stderr.contains(expected), "{command}: {stderr}");
        }
    }
}

/// A TLS connection to `base` that asked for HTTP/2 by ALPN, each read waiting at most 10 s.
fn h2_connection(
    pki: &Pki,
    base: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der()).expect("ca");
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let tls = rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("tls");
    let tcp = blocking_connect(base, Duration::from_secs(10));
    rustls::StreamOwned::new(tls, tcp)
}

/// Reads until the server ends the connection; how long that took. A read that waits 10 s
/// means it is still open.
fn until_closed(
    s: &mut rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>,
) -> Duration {
    use std::io::Read;
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("still open after {:?}", started.elapsed())
            }
            Err(_) => return started.elapsed(),
        }
    }
}

/// HTTP/2 connections that hold a descriptor and do nothing are closed as HTTP/1.1 ones are:
/// one that sends not even its preface within `client_header_timeout_ms`, and one idle after
/// it for `keepalive_timeout_ms` (before, both stayed open for good: enough of them took
/// every file descriptor, and the gateway stopped answering).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed() {
    use std::io::Write;
    let pki = Pki::new("h2 idle test CA");
    let g = start_with(Setup {
        extra_config: tls_config(Some(&pki), None),
        server_extra: "client_header_timeout_ms = 1000\nkeepalive_timeout_ms = 1500".into(),
        ..Setup::default()
    });
    // A stream whose events come further apart than the idle limit is not idle: it ends whole.
    let h2 = tls_client(&pki, false);
    let resp = h2
        .post(format!("{}/v1/chat/completions", https(&g.main)))
        .bearer_auth(KEY)
        .header("x-mock-chunks", "3")
        .header("x-mock-delay-ms", "1000")
        .json(&chat_body("echo-1", true))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    let text = resp.text().await.expect("whole stream");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let mut silent = tokio::task::block_in_place(|| h2_connection(&pki, &g.main));
    // The handshake: an empty write flushes it.
    silent.write_all(b"").expect("handshake");
    while silent.conn.is_handshaking() {
        silent
            .conn
            .complete_io(&mut silent.sock)
            .expect("handshake");
    }
    assert_eq!(silent.conn.alpn_protocol(), Some(&b"h2"[..]));
    let took = tokio::task::block_in_place(|| until_closed(&mut silent));
    assert!(took < Duration::from_secs(5), "{took:?}");

    let mut idle = h2_connection(&pki, &g.main);
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .expect("preface and settings");
    let took = tokio::task::block_in_place(|| until_closed(&mut idle));
    assert!(
        (Duration::from_millis(1_000)..Duration::from_secs(6)).contains(&took),
        "{took:?}"
    );
}
