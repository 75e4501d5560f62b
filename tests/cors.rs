//! CORS on the API, both listeners: preflights answered before auth, allowed origins get the
//! headers on every reply (the gateway's own, the upstream's, streams), others get none.

mod common;

use common::*;

const APP: &str = "https://app.example";

fn cors_setup() -> Setup {
    Setup {
        extra_config: format!("[cors]\nallow_origins = [\"{APP}\"]\nmax_age_seconds = 300\n"),
        ..Setup::default()
    }
}

#[tokio::test]
async fn preflights_from_an_allowed_origin_get_204_and_others_403() {
    let g = start_with(cors_setup());
    for base in g.bases() {
        let resp = client()
            .request(
                reqwest::Method::OPTIONS,
                format!("{base}/v1/chat/completions"),
            )
            .header("origin", APP)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type, x-stainless-os",
            )
            .send()
            .await
            .expect("preflight");
        assert_eq!(resp.status(), 204);
        let h = resp.headers();
        assert_eq!(h["access-control-allow-origin"], APP);
        assert!(
            h["access-control-allow-methods"]
                .to_str()
                .expect("ascii")
                .contains("POST")
        );
        assert_eq!(
            h["access-control-allow-headers"],
            "authorization, content-type, x-stainless-os"
        );
        assert_eq!(h["access-control-max-age"], "300");
        assert_eq!(h["vary"], "Origin");

        let refused = client()
            .request(
                reqwest::Method::OPTIONS,
                format!("{base}/v1/chat/completions"),
            )
            .header("origin", "https://evil.example")
            .header("access-control-request-method", "POST")
            .send()
            .await
            .expect("preflight");
        assert!(
            !refused
                .headers()
                .contains_key("access-control-allow-origin")
        );
        let (status, e) = error_of(refused).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (403, Some("origin_not_allowed"))
        );
    }
}

#[tokio::test]
async fn every_reply_to_an_allowed_origin_carries_the_cors_headers() {
    let g = start_with(cors_setup());
    let ask = |origin: &'static str, key: &'static str, stream: bool| {
        let base = g.direct.clone();
        async move {
            client()
                .post(format!("{base}/v1/chat/completions"))
                .header("origin", origin)
                .bearer_auth(key)
                .json(&chat_body("echo-1", stream))
                .send()
                .await
                .expect("send")
        }
    };
    for (key, stream, status) in [
        (KEY, false, 200),
        (KEY, true, 200),
        ("sk-nope-000000000000", false, 401),
    ] {
        let resp = ask(APP, key, stream).await;
        assert_eq!(resp.status(), status);
        let h = resp.headers();
        assert_eq!(h["access-control-allow-origin"], APP, "{status} {stream}");
        assert!(
            h["access-control-expose-headers"]
                .to_str()
                .expect("ascii")
                .contains("x-request-id"),
            "{status}"
        );
    }
    let other = ask("https://evil.example", KEY, false).await;
    assert_eq!(other.status(), 200);
    assert!(!other.headers().contains_key("access-control-allow-origin"));
}

#[tokio::test]
async fn without_cors_configured_there_are_no_cors_headers_and_options_is_405() {
    let g = start();
    let resp = client()
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/v1/chat/completions", g.main),
        )
        .header("origin", APP)
        .header("access-control-request-method", "POST")
        .send()
        .await
        .expect("preflight");
    assert_eq!(resp.status(), 405);
    assert!(!resp.headers().contains_key("access-control-allow-origin"));
}

/// The usage and billing APIs (bearer key) are callable from an allowed origin, CSV included;
/// the console and the pages (session cookie) never answer with CORS headers.
#[tokio::test]
async fn the_usage_and_billing_apis_answer_cors_and_the_console_never_does() {
    let g = start_with(cors_setup());
    for base in g.bases() {
        for path in [
            "/api/usage",
            "/api/usage.csv",
            "/api/usage/summary",
            "/v1/dashboard/billing/subscription",
        ] {
            let pre = client()
                .request(reqwest::Method::OPTIONS, format!("{base}{path}"))
                .header("origin", APP)
                .header("access-control-request-method", "GET")
                .header("access-control-request-headers", "authorization")
                .send()
                .await
                .expect("preflight");
            assert_eq!(pre.status(), 204, "{path}");
            assert_eq!(pre.headers()["access-control-allow-origin"], APP);
            let resp = client()
                .get(format!("{base}{path}"))
                .header("origin", APP)
                .bearer_auth(KEY)
                .send()
                .await
                .expect("get");
            assert_eq!(resp.status(), 200, "{path}");
            let h = resp.headers();
            assert_eq!(h["access-control-allow-origin"], APP, "{path}");
            assert!(
                h["access-control-expose-headers"]
                    .to_str()
                    .expect("ascii")
                    .contains("content-disposition")
            );
            // Errors too: a wrong key is readable by the page.
            let resp = client()
                .get(format!("{base}{path}"))
                .header("origin", APP)
                .bearer_auth("sk-wrong")
                .send()
                .await
                .expect("get");
            assert_eq!(resp.status(), 401, "{path}");
            assert_eq!(resp.headers()["access-control-allow-origin"], APP, "{path}");
        }
        for path in ["/console/api/session", "/"] {
            let resp = client()
                .get(format!("{base}{path}"))
                .header("origin", APP)
                .send()
                .await
                .expect("get");
            assert!(
                !resp.headers().contains_key("access-control-allow-origin"),
                "{path}"
            );
            let pre = client()
                .request(reqwest::Method::OPTIONS, format!("{base}{path}"))
                .header("origin", APP)
                .header("access-control-request-method", "POST")
                .send()
                .await
                .expect("preflight");
            assert_ne!(pre.status(), 204, "{path}");
            assert!(
                !pre.headers().contains_key("access-control-allow-origin"),
                "{path}"
            );
        }
    }
}
