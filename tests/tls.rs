//! `https://` upstreams: TLS with SNI, verified against the system roots (which honour
//! `SSL_CERT_FILE`, so the test can trust its own CA without touching the machine's store).

mod common;

use common::pki::Pki;
use common::*;

/// A private CA and a server certificate for 127.0.0.1 and localhost, signed by it.
fn pki() -> Pki {
    Pki::new("modelgate test CA")
}

fn tls_pool(port: u16) -> String {
    format!(
        r#"
[[pools]]
pass_headers = ["x-mock-*"]
name = "secure"
upstreams = ["https://127.0.0.1:{port}"]
api_key = "{POOL_KEY}"

[[models]]
name = "secure-model"
pool = "secure"
upstream_model = "echo-1"
"#
    )
}

#[tokio::test]
async fn an_https_upstream_is_reached_and_verified_against_the_system_roots() {
    let pki = pki();
    let mock = start_mock(&[
        "--tls-cert",
        &pki.path("cert.pem"),
        "--tls-key",
        &pki.path("key.pem"),
    ]);
    let g = start_with(Setup {
        extra_config: tls_pool(mock.port),
        env: vec![("SSL_CERT_FILE".into(), pki.path("ca.pem"))],
        ..Setup::default()
    });
    for base in g.bases() {
        let resp = post_json(
            &base,
            "/v1/chat/completions",
            &chat_body("secure-model", false),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let connection = resp.headers()["x-mock-peer"].clone();
        assert_eq!(
            resp.headers()["x-mock-authorization"],
            format!("Bearer {POOL_KEY}")
        );
        assert_eq!(resp.headers()["x-mock-model"], "echo-1");
        let v: serde_json::Value = resp.json().await.expect("json");
        assert_eq!(v["choices"][0]["message"]["content"], MOCK_TEXT);
        let streamed = post_json(
            &base,
            "/v1/chat/completions",
            &chat_body("secure-model", true),
        )
        .await;
        // The TLS connection was kept and carried the next request (no new handshake).
        assert_eq!(streamed.headers()["x-mock-peer"], connection);
        let text = streamed.text().await.expect("body");
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    }
}

#[tokio::test]
async fn an_https_upstream_with_an_untrusted_certificate_is_502() {
    let pki = pki();
    let mock = start_mock(&[
        "--tls-cert",
        &pki.path("cert.pem"),
        "--tls-key",
        &pki.path("key.pem"),
    ]);
    // No SSL_CERT_FILE: the private CA is not trusted.
    let g = start_with(Setup {
        extra_config: tls_pool(mock.port),
        ..Setup::default()
    });
    let (status, e) = error_of(
        post_json(
            &g.main,
            "/v1/chat/completions",
            &chat_body("secure-model", false),
        )
        .await,
    )
    .await;
    assert_eq!((status, e["code"].as_str()), (502, Some("upstream_error")));
}
