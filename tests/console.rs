//! The web console on `main`: sign-in (wrong, right, throttled), the session cookie's flags and
//! its survival across a restart, CSRF refusals, every console route, key create → use → edit
//! → disable → rotate → delete through the keys file (comments kept), usage across keys, models,
//! and the audit log. All console paths are 404 on `direct`.
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{Value, json};

const PASSWORD: &str = "correct horse battery staple";

fn console_setup() -> Setup {
    Setup {
        extra_config: "\n[console]\nuser = \"admin\"\npassword = \"env:MG_TEST_CONSOLE_PW\"\n"
            .into(),
        env: vec![("MG_TEST_CONSOLE_PW".into(), PASSWORD.into())],
        ..Setup::default()
    }
}

fn client_no_cookies() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn login(base: &str, user: &str, password: &str) -> reqwest::Response {
    client_no_cookies()
        .post(format!("{base}/console/login"))
        .json(&json!({"user": user, "password": password}))
        .send()
        .await
        .unwrap()
}

/// A signed-in console: the session cookie and the page's CSRF token.
struct Console {
    base: String,
    cookie: String,
    csrf: String,
}

impl Console {
    async fn sign_in(base: &str) -> Console {
        let resp = login(base, "admin", PASSWORD).await;
        assert_eq!(resp.status(), 204);
        let set = resp.headers()["set-cookie"].to_str().unwrap().to_string();
        let cookie = set.split(';').next().unwrap().to_string();
        let mut c = Console {
            base: base.into(),
            cookie,
            csrf: String::new(),
        };
        let s = c.get("/console/api/session").await;
        assert_eq!(s.status(), 200);
        let s: Value = s.json().await.unwrap();
        assert_eq!(s["user"], "admin");
        c.csrf = s["csrf"].as_str().unwrap().to_string();
        c
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        client_no_cookies()
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap()
    }

    /// A state-changing call as the page makes it: cookie, same Origin, CSRF token.
    async fn send(&self, method: &str, path: &str, body: Option<Value>) -> reqwest::Response {
        let mut req = client_no_cookies()
            .request(method.parse().unwrap(), format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("origin", &self.base)
            .header("x-csrf-token", &self.csrf);
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.unwrap()
    }

    async fn json(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let resp = self.send(method, path, body).await;
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }
}

async fn models_status(base: &str, key: &str) -> u16 {
    get(base, "/v1/models", Some(key)).await.status().as_u16()
}

/// Keys take effect through the reload; a change is visible within 3 s.
async fn await_status(base: &str, key: &str, want: u16) {
    common::eventually_async(
        std::time::Duration::from_secs(3),
        &format!("never {want}"),
        async || {
            let got = models_status(base, key).await;
            if got == want {
                Ok(())
            } else {
                Err(format!("{got}, wanted {want}"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn every_console_path_is_404_on_direct() {
    let g = start_with(console_setup());
    for (method, path) in [
        ("GET", "/console"),
        ("POST", "/console/login"),
        ("POST", "/console/logout"),
        ("GET", "/console/api/keys"),
        ("POST", "/console/api/keys"),
        ("GET", "/console/api/usage"),
        ("GET", "/console/api/models"),
    ] {
        let resp = client_no_cookies()
            .request(method.parse().unwrap(), format!("{}{path}", g.direct))
            .json(&json!({"user": "admin", "password": PASSWORD}))
            .send()
            .await
            .unwrap();
        let (status, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (404, Some("not_found")),
            "{method} {path}"
        );
    }
    let page = get(&g.main, "/", None).await;
    assert_eq!(page.status(), 200);
    assert!(page.headers().contains_key("content-security-policy"));
    let html = page.text().await.unwrap();
    for label in [">User</label>", ">Password</label>", ">Sign in</button>"] {
        assert!(html.contains(label), "{label}");
    }
}

#[tokio::test]
async fn sign_in_wrong_and_right_with_a_strict_cookie_and_sign_out() {
    let g = start_with(console_setup());
    for (user, pw) in [("admin", "wrong"), ("root", PASSWORD), ("", "")] {
        let (status, e) = error_of(login(&g.main, user, pw).await).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (401, Some("invalid_credentials"))
        );
    }
    let resp = login(&g.main, "admin", PASSWORD).await;
    assert_eq!(resp.status(), 204);
    let set = resp.headers()["set-cookie"].to_str().unwrap().to_string();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set.contains(flag), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP listener: {set}");
    let (status, e) = error_of(get(&g.main, "/console/api/keys", None).await).await;
    assert_eq!((status, e["code"].as_str()), (401, Some("not_signed_in")));
    let c = Console::sign_in(&g.main).await;
    assert_eq!(c.get("/console/api/keys").await.status(), 200);
    // Sign-out needs the page's proof too, then ends the session for good.
    let bare = client_no_cookies()
        .post(format!("{}/console/logout", g.main))
        .header("cookie", &c.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(bare).await.0, 403);
    // The failed attempts are in the audit log, newest first; a name other than the
    // console's is not written (it may be a password typed in the wrong box).
    // (Written beside the answers: awaited.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (audit, mut failed) = loop {
        let audit: Value = c.get("/console/api/audit").await.json().await.unwrap();
        let failed: Vec<(String, String)> = audit["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["action"] == "login_failed")
            .map(|e| {
                assert_eq!(e["detail"]["client"], "127.0.0.1", "{e}");
                (
                    e["user"].as_str().unwrap().to_string(),
                    e["detail"]["reason"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        if failed.len() >= 3 || std::time::Instant::now() > deadline {
            break (audit, failed);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    failed.sort();
    let want = [
        ("", "unknown user"),
        ("", "unknown user"),
        ("admin", "wrong password"),
    ]
    .map(|(u, r)| (u.to_string(), r.to_string()));
    assert_eq!(failed, want);
    assert!(!audit.to_string().contains("root"), "{audit}");
    assert_eq!(c.send("POST", "/console/logout", None).await.status(), 204);
    assert_eq!(error_of(c.get("/console/api/keys").await).await.0, 401);
}

/// A sign-in whose body's framing cannot be read (a chunk size that is not one) is the
/// client's 400, not the gateway's 500, and the connection ends after it.
#[tokio::test]
async fn a_sign_in_body_with_broken_framing_is_a_400() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = start_with(console_setup());
    for size in ["zz", "-1", "fffffffffffffffffffff"] {
        let mut s = raw_connect(&g.main).await;
        let request = format!(
            "POST /console/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n{size}\r\n{{}}\r\n0\r\n\r\n"
        );
        s.write_all(request.as_bytes()).await.expect("send");
        let mut reply = String::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            s.read_to_string(&mut reply),
        )
        .await
        .expect("the connection ends");
        assert!(reply.starts_with("HTTP/1.1 400"), "{size}: {reply}");
        assert!(reply.contains(r#""param":"body""#), "{size}: {reply}");
    }
}

/// A console password changed in the config file is in force within the reload's 2 s, and
/// ends the sessions made with the old one (the old password went on signing in until a
/// restart, while the log said the file was reloaded). A section only a restart puts in force
/// is named in a warning.
#[tokio::test]
async fn a_console_password_rotated_in_the_config_file_is_in_force_at_once() {
    let mut g = start_with(console_setup());
    let old = Console::sign_in(&g.main).await;
    let path = g.dir.path().join("modelgate.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    let rotated = config.replace(
        "password = \"env:MG_TEST_CONSOLE_PW\"",
        "password = \"a-new-console-password\"",
    );
    assert_ne!(rotated, config);
    let rotated = rotated.replace("[limits]\n", "[limits]\nauth_failures_per_minute = 7\n");
    std::fs::write(&path, rotated).unwrap();
    // (Sign-in attempts made while waiting would count as failures: the reload is awaited.)
    common::eventually_async(std::time::Duration::from_secs(5), "no reload", async || {
        if metric_value(&g, "modelgate_config_reloads_total").await < 1.0 {
            Err(String::new())
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!(
        login(&g.main, "admin", "a-new-console-password")
            .await
            .status(),
        204
    );
    assert_eq!(login(&g.main, "admin", PASSWORD).await.status(), 401);
    assert_eq!(error_of(old.get("/console/api/keys").await).await.0, 401);
    g.terminate();
    let log = g.take_stderr();
    assert!(
        log.contains("in force only after a restart") && log.contains("sections=limits"),
        "{log}"
    );
}

#[tokio::test]
async fn failed_sign_ins_are_throttled_per_address() {
    let g = start_with(console_setup());
    for _ in 0..10 {
        assert_eq!(login(&g.main, "admin", "guess").await.status(), 401);
    }
    let resp = login(&g.main, "admin", PASSWORD).await;
    assert!(resp.headers().contains_key("retry-after"));
    let (status, e) = error_of(resp).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
}

#[tokio::test]
async fn state_changes_need_the_same_origin_or_the_csrf_token() {
    let g = start_with(console_setup());
    let c = Console::sign_in(&g.main).await;
    let body = json!({"id": "csrf-probe"});
    let post = |origin: Option<&str>, token: Option<&str>| {
        let mut req = client_no_cookies()
            .post(format!("{}/console/api/keys", g.main))
            .header("cookie", &c.cookie)
            .json(&body);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(t) = token {
            req = req.header("x-csrf-token", t);
        }
        req.send()
    };
    for (origin, token) in [
        (None, None),
        (Some("http://evil.example"), None),
        (None, Some("not-the-token")),
        (Some("null"), None),
    ] {
        let (status, e) = error_of(post(origin, token).await.unwrap()).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (403, Some("csrf_rejected")),
            "{origin:?} {token:?}"
        );
    }
    // A change with no session cookie at all is refused with 403 too (a read is 401), the
    // page's own origin notwithstanding; so is one after sign-out.
    let origin = g.main.clone();
    for (method, path) in [
        ("POST", "/console/api/keys"),
        ("PATCH", "/console/api/keys/demo"),
        ("DELETE", "/console/api/keys/demo"),
        ("POST", "/console/logout"),
    ] {
        let resp = client_no_cookies()
            .request(method.parse().unwrap(), format!("{}{path}", g.main))
            .header("origin", &origin)
            .json(&body)
            .send()
            .await
            .unwrap();
        let (status, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (403, Some("not_signed_in")),
            "{method} {path}"
        );
    }
    // A cross-site sign-in form is refused too.
    let resp = client_no_cookies()
        .post(format!("{}/console/login", g.main))
        .header("origin", "http://evil.example")
        .json(&json!({"user": "admin", "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await.0, 403);
    let keys: Value = c.get("/console/api/keys").await.json().await.unwrap();
    assert!(
        !keys.to_string().contains("csrf-probe"),
        "nothing was created"
    );
    assert_eq!(post(Some(&g.main), None).await.unwrap().status(), 200);
    let again = json!({"id": "csrf-probe-2"});
    let by_token = client_no_cookies()
        .post(format!("{}/console/api/keys", g.main))
        .header("cookie", &c.cookie)
        .header("x-csrf-token", &c.csrf)
        .json(&again)
        .send()
        .await
        .unwrap();
    assert_eq!(by_token.status(), 200);
}

/// Behind a TLS-terminating proxy or CDN (`[console] public_origin`): the browser's origin is
/// the proxy's, https, while the gateway is reached in plain HTTP under another host. Sign-in
/// and changes from that origin are the console's own, and its cookie is Secure; others stay
/// refused.
#[tokio::test]
async fn behind_a_tls_proxy_the_public_origin_signs_in_with_a_secure_cookie() {
    let mut setup = console_setup();
    setup.extra_config += "public_origin = \"https://console.example.com:443/\"\n";
    let g = start_with(setup);
    let sign_in = |origin: &'static str| {
        client_no_cookies()
            .post(format!("{}/console/login", g.main))
            .header("origin", origin)
            .header("host", "console.example.com")
            .json(&json!({"user": "admin", "password": PASSWORD}))
            .send()
    };
    let resp = sign_in("https://console.example.com").await.unwrap();
    assert_eq!(resp.status(), 204);
    let cookie = resp.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    let session = cookie.split(';').next().unwrap().to_string();
    let (status, e) = error_of(sign_in("https://evil.example").await.unwrap()).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (403, Some("csrf_rejected")),
        "{e}"
    );
    // A change from the public origin, without the CSRF token, is the console's own.
    let made = client_no_cookies()
        .post(format!("{}/console/api/keys", g.main))
        .header("origin", "https://console.example.com")
        .header("cookie", &session)
        .json(&json!({"id": "via-proxy"}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 200, "{:?}", made.text().await);
}

#[tokio::test]
async fn a_key_made_in_the_console_works_then_is_limited_disabled_rotated_and_deleted() {
    let g = start_with(console_setup());
    let keys_file = g.dir.path().join("keys.toml");
    let original = std::fs::read_to_string(&keys_file).unwrap();
    std::fs::write(
        &keys_file,
        format!("# Team keys: edited by hand and by the console.\n{original}"),
    )
    .unwrap();
    let c = Console::sign_in(&g.main).await;
    let made = c
        .json(
            "POST",
            "/console/api/keys",
            Some(json!({"id": "team-a", "models": ["echo-*"], "budget": 5})),
        )
        .await;
    let secret = made["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("sk-") && secret.len() == 51, "{secret}");
    assert_eq!(made["key"]["budget"], 5.0);
    await_status(&g.direct, &secret, 200).await;
    let text = std::fs::read_to_string(&keys_file).unwrap();
    assert!(
        text.starts_with("# Team keys: edited by hand and by the console.\n"),
        "{text}"
    );
    assert!(
        !text.contains(&secret),
        "the secret itself is never written"
    );
    assert!(text.contains(&sha256_hex(secret.as_bytes())));
    let list = c.get("/console/api/keys").await.text().await.unwrap();
    assert!(!list.contains(&secret));
    let listed: Value = serde_json::from_str(&list).unwrap();
    let team = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == "team-a")
        .unwrap()
        .clone();
    assert_eq!(
        team["hint"].as_str().unwrap(),
        format!("{}…{}", &secret[..7], &secret[47..])
    );
    assert_eq!(team["models"], json!(["echo-*"]));
    assert!(listed.to_string().contains("\"id\":\"full\""));

    // rpm = 1: the second chat within the minute is refused.
    c.json("PATCH", "/console/api/keys/team-a", Some(json!({"rpm": 1})))
        .await;
    let body = chat_body("echo-1", false);
    let chat = || send(&g.main, "/v1/chat/completions", Some(&secret), &body, &[]);
    common::eventually_async(
        std::time::Duration::from_secs(3),
        "rpm 1 not in force",
        async || {
            let first = chat().await.status().as_u16();
            let second = chat().await.status().as_u16();
            if (first, second) == (200, 429) || (first, second) == (429, 429) {
                Ok(())
            } else {
                Err(format!("{first} {second}"))
            }
        },
    )
    .await;
    c.json(
        "PATCH",
        "/console/api/keys/team-a",
        Some(json!({"rpm": null, "disabled": true})),
    )
    .await;
    await_status(&g.main, &secret, 401).await;
    c.json(
        "PATCH",
        "/console/api/keys/team-a",
        Some(json!({"disabled": false})),
    )
    .await;
    await_status(&g.main, &secret, 200).await;
    let rotated = c
        .json("POST", "/console/api/keys/team-a/rotate", None)
        .await;
    let new_secret = rotated["secret"].as_str().unwrap().to_string();
    await_status(&g.main, &new_secret, 200).await;
    await_status(&g.main, &secret, 401).await;
    // Bad edits are refused whole with a clear 400 and leave the file as it was.
    let before = std::fs::read_to_string(&keys_file).unwrap();
    for bad in [
        json!({"endpoints": ["nope"]}),
        json!({"secret": "sk-mine"}),
        json!({"rpm": "fast"}),
        json!({"rpm": 0}),
    ] {
        let (status, e) = error_of(
            c.send("PATCH", "/console/api/keys/team-a", Some(bad.clone()))
                .await,
        )
        .await;
        assert_eq!(status, 400, "{bad}");
        // The refusal names the file, not where it lies on the server.
        let message = e["message"].as_str().unwrap();
        let dir = g.dir.path().to_string_lossy();
        assert!(!message.contains(dir.as_ref()), "{message}");
    }
    let (_, e) = error_of(
        c.send("PATCH", "/console/api/keys/team-a", Some(json!({"rpm": 0})))
            .await,
    )
    .await;
    let message = e["message"].as_str().unwrap();
    assert!(message.starts_with("keys.toml:"), "{message}");
    assert_eq!(std::fs::read_to_string(&keys_file).unwrap(), before);
    let (status, e) = error_of(
        c.send("POST", "/console/api/keys", Some(json!({"id": "team-a"})))
            .await,
    )
    .await;
    assert_eq!((status, e["code"].as_str()), (409, Some("conflict")));
    let (status, _) = error_of(
        c.send("PATCH", "/console/api/keys/nobody", Some(json!({"rpm": 1})))
            .await,
    )
    .await;
    assert_eq!(status, 404);
    c.json("DELETE", "/console/api/keys/team-a", None).await;
    await_status(&g.main, &new_secret, 401).await;
    assert!(
        std::fs::read_to_string(&keys_file)
            .unwrap()
            .starts_with("# Team keys")
    );

    let audit = c.get("/console/api/audit").await.text().await.unwrap();
    assert!(!audit.contains(&secret) && !audit.contains(&new_secret));
    let audit: Value = serde_json::from_str(&audit).unwrap();
    let actions: Vec<&str> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["key_id"] == "team-a")
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["delete", "rotate", "update", "update", "update", "create"]
    );
    assert!(
        audit["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["user"] == "admin")
    );
}

#[tokio::test]
async fn usage_models_and_sessions_across_a_restart() {
    let g = start_with(console_setup());
    for key in [KEY, OTHER_KEY] {
        let resp = send(
            &g.main,
            "/v1/chat/completions",
            Some(key),
            &chat_body("echo-1", false),
            &[],
        )
        .await;
        assert_eq!(resp.status(), 200);
    }
    let c = Console::sign_in(&g.main).await;
    let page = common::eventually_async(
        std::time::Duration::from_secs(5),
        "fewer than 2 usage records",
        async || {
            let page: Value = c
                .get("/console/api/usage?limit=100")
                .await
                .json()
                .await
                .unwrap();
            if page["data"].as_array().unwrap().len() >= 2 {
                Ok(page)
            } else {
                Err(page.to_string())
            }
        },
    )
    .await;
    let ids: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key_id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"full") && ids.contains(&"other"), "{ids:?}");
    let one: Value = c
        .get("/console/api/usage?key_id=other")
        .await
        .json()
        .await
        .unwrap();
    assert!(
        one["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["key_id"] == "other")
    );
    let sum: Value = c
        .get("/console/api/usage/summary?tz=Asia/Kolkata")
        .await
        .json()
        .await
        .unwrap();
    let by_key: Vec<&str> = sum["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key_id"].as_str().unwrap())
        .collect();
    assert!(by_key.contains(&"full") && by_key.contains(&"other"));
    let csv = c.get("/console/api/usage.csv?key_id=full").await;
    assert!(
        csv.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains("usage-full-")
    );
    assert!(
        csv.text()
            .await
            .unwrap()
            .lines()
            .skip(1)
            .all(|l| l.contains(",full,"))
    );
    let (status, _) = error_of(c.get("/console/api/usage?colour=red").await).await;
    assert_eq!(status, 400);
    let models: Value = c.get("/console/api/models").await.json().await.unwrap();
    assert!(
        models["models"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "big-model")
    );
    let pools = models["pools"].to_string();
    assert!(!pools.contains(POOL_KEY), "no credential: {pools}");
    assert!(pools.contains("\"has_api_key\":true"));
    // A model the config file gains shows once it is in force (the tab showed the models of
    // the start).
    let path = g.dir.path().join("modelgate.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        format!("{config}\n[[models]]\nname = \"late-model\"\npool = \"local\"\n"),
    )
    .unwrap();
    common::eventually_async(
        std::time::Duration::from_secs(5),
        "late-model not listed",
        async || {
            let models: Value = c.get("/console/api/models").await.json().await.unwrap();
            if models["models"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == "late-model")
            {
                Ok(())
            } else {
                Err(models.to_string())
            }
        },
    )
    .await;
    // A usage key cannot reach the console's API, and the console's session is kept over a restart.
    assert_eq!(
        error_of(get(&g.main, "/console/api/usage", Some(KEY)).await)
            .await
            .0,
        401
    );
    let g = g.restart();
    let again = Console {
        base: g.main.clone(),
        cookie: c.cookie.clone(),
        csrf: c.csrf.clone(),
    };
    assert_eq!(again.get("/console/api/session").await.status(), 200);
    again
        .json(
            "POST",
            "/console/api/keys",
            Some(json!({"id": "after-restart"})),
        )
        .await;
}

/// A sign-in from `address` (behind the trusted loopback proxy).
async fn login_from(base: &str, address: &str, password: &str) -> reqwest::Response {
    client_no_cookies()
        .post(format!("{base}/console/login"))
        .header("x-forwarded-for", address)
        .json(&json!({"user": "admin", "password": password}))
        .send()
        .await
        .unwrap()
}

/// Guessing from a crowd of addresses, each under its own limit: past 30 failures a minute
/// across them all, a new address waits its turn (one password check a second for all of
/// them, 429 past a wait of two seconds), while an address that signed in before goes
/// straight on. Every attempt is counted on `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn a_crowd_of_addresses_guessing_is_held_and_a_known_user_still_signs_in() {
    let mut setup = console_setup();
    setup.server_extra = "trusted_proxies = [\"127.0.0.1/32\"]".into();
    let g = start_with(setup);
    assert_eq!(
        login_from(&g.main, "10.9.0.1", PASSWORD).await.status(),
        204
    );
    for i in 0..30 {
        let r = login_from(&g.main, &format!("10.1.0.{i}"), "guess").await;
        assert_eq!(r.status(), 401);
    }
    // Forty more guesses from forty new addresses at once: about three get their turn in the
    // two seconds a wait may last, the rest are 429.
    let started = std::time::Instant::now();
    let guesses: Vec<_> = (0..40)
        .map(|i| {
            let base = g.main.clone();
            tokio::spawn(async move { login_from(&base, &format!("10.2.0.{i}"), "guess").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in guesses {
        statuses.push(t.await.unwrap().status().as_u16());
    }
    let checked = statuses.iter().filter(|s| **s == 401).count();
    let held = statuses.iter().filter(|s| **s == 429).count();
    assert!((1..=4).contains(&checked), "{statuses:?}");
    assert_eq!(checked + held, 40, "{statuses:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(6));
    // The console's own user, from where it signed in before, at once.
    let at = std::time::Instant::now();
    assert_eq!(
        login_from(&g.main, "10.9.0.1", PASSWORD).await.status(),
        204
    );
    assert!(at.elapsed() < std::time::Duration::from_secs(1));
    let metric = |result: &str| {
        let g = &g;
        let prefix = format!("modelgate_console_sign_ins_total{{result=\"{result}\"}}");
        async move { common::metric_value(g, &prefix).await }
    };
    assert_eq!(metric("ok").await, 2.0);
    assert_eq!(metric("failed").await, (30 + checked) as f64);
    assert_eq!(metric("held").await, held as f64);
    // After a restart the gateway still knows where its user signed in from (the audit log):
    // with the gate closed and new addresses queued for turns, that address goes on at once.
    let g = g.restart();
    for i in 0..30 {
        let r = login_from(&g.main, &format!("10.3.0.{i}"), "guess").await;
        assert_eq!(r.status(), 401);
    }
    let queued: Vec<_> = (0..6)
        .map(|i| {
            let base = g.main.clone();
            tokio::spawn(async move { login_from(&base, &format!("10.4.0.{i}"), "guess").await })
        })
        .collect();
    common::eventually_async(
        std::time::Duration::from_secs(5),
        "no guess held",
        async || match common::metric_value(&g, "modelgate_console_sign_ins_total{result=\"held\"}")
            .await
        {
            n if n > 0.0 => Ok(()),
            n => Err(format!("{n} held")),
        },
    )
    .await;
    let at = std::time::Instant::now();
    assert_eq!(
        login_from(&g.main, "10.9.0.1", PASSWORD).await.status(),
        204
    );
    assert!(at.elapsed() < std::time::Duration::from_secs(1));
    for t in queued {
        t.await.unwrap();
    }
}
