//! A fleet's servers over TLS: Postgres taking TLS connections only (`sslmode=require`) and
//! Redis on `rediss://`, both with a certificate of a private CA the gateway trusts through
//! `SSL_CERT_FILE`. Records reach Postgres and limits are counted in Redis, never in plain.

mod common;

use std::time::Duration;

use common::pg::Postgres;
use common::pki::Pki;
use common::redis::Redis;
use common::{KEY, Setup, chat_body, request_id, send, start_with};

/// A private CA and a certificate for 127.0.0.1 signed by it: (pki, ca, cert, key) paths.
fn pki() -> (Pki, String, String, String) {
    let pki = Pki::new("modelgate fleet test CA");
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("cert.pem"),
        pki.path("key.pem"),
    );
    (pki, ca, cert, key)
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_and_redis_are_reached_over_tls_only() {
    if !Postgres::installed() || !Redis::installed() {
        return;
    }
    let (_pki, ca, cert, key) = pki();
    let pg = Postgres::start_tls(std::path::Path::new(&cert), std::path::Path::new(&key));
    let redis = Redis::start_tls(&cert, &key, &ca);
    let g = start_with(Setup {
        extra_config: format!(
            "\n[storage]\npostgres = \"postgres://postgres@127.0.0.1:{}/postgres?sslmode=require\"\n",
            pg.port
        ),
        limits_extra: format!("redis = \"{}\"\n", redis.url()),
        env: vec![("SSL_CERT_FILE".into(), ca.clone())],
        ..Setup::default()
    });
    // rpm2 is counted in Redis: two pass, the third is refused.
    let statuses = [
        send(
            &g.direct,
            "/v1/chat/completions",
            Some(common::RPM2_KEY),
            &chat_body("echo-1", false),
            &[],
        )
        .await
        .status()
        .as_u16(),
        send(
            &g.direct,
            "/v1/chat/completions",
            Some(common::RPM2_KEY),
            &chat_body("echo-1", false),
            &[],
        )
        .await
        .status()
        .as_u16(),
        send(
            &g.direct,
            "/v1/chat/completions",
            Some(common::RPM2_KEY),
            &chat_body("echo-1", false),
            &[],
        )
        .await
        .status()
        .as_u16(),
    ];
    assert_eq!(statuses, [200, 200, 429]);
    let metrics = common::get(&g.admin, "/metrics", None)
        .await
        .text()
        .await
        .expect("metrics");
    assert!(
        metrics.contains("modelgate_redis_up 1"),
        "redis not answering over TLS"
    );
    assert!(
        metrics.contains("modelgate_limits_fallback_total 0"),
        "limits fell back"
    );
    // A record made it into Postgres over TLS and comes back through the usage API.
    let r = send(
        &g.direct,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("echo-1", false),
        &[],
    )
    .await;
    let id = request_id(&r);
    common::eventually_async(
        Duration::from_secs(10),
        "the record never reached postgres",
        async || {
            let page: serde_json::Value = common::get(&g.direct, "/api/usage?limit=100", Some(KEY))
                .await
                .json()
                .await
                .expect("json");
            if page["data"]
                .as_array()
                .is_some_and(|d| d.iter().any(|r| r["request_id"] == id))
            {
                Ok(())
            } else {
                Err(String::new())
            }
        },
    )
    .await;
    let metrics = common::get(&g.admin, "/metrics", None)
        .await
        .text()
        .await
        .expect("metrics");
    assert!(
        metrics.contains("modelgate_usage_spool_bytes 0"),
        "records spooled: postgres unreachable"
    );
}
