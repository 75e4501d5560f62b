//! The config loader's tests: files that load, and every problem named where it is written.
use super::*;
use std::time::Duration;

const GOOD: &str = r#"
[listeners]
main = "127.0.0.1:8080"
direct = "127.0.0.1:8081"
[keys]
file = "keys.toml"
[[pools]]
name = "local"
upstreams = ["http://127.0.0.1:9100", "https://api.example.com/openai/"]
[[models]]
name = "echo-1"
pool = "local"
price = { prompt = 1.0, completion = 2.0 }
"#;

#[test]
fn a_good_config_loads_and_paths_resolve_against_its_folder() {
    let c = Config::parse(Path::new("/etc/mg/modelgate.toml"), GOOD).expect("valid");
    assert_eq!(c.fixed.keys.file, Path::new("/etc/mg/keys.toml"));
    let up = &c.live.pools[0].upstreams[1];
    assert!(up.tls);
    assert_eq!(
        (up.host.as_str(), up.port, up.base_path.as_str()),
        ("api.example.com", 443, "/openai")
    );
    assert_eq!(c.live.models[0].upstream_model, "echo-1");
    assert_eq!(c.fixed.limits.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
}

/// An upstream URL that could not be asked (a space in it) is refused by `check`, and one
/// with a user and password is refused without repeating them.
#[test]
fn an_upstream_url_with_a_space_or_a_password_is_refused() {
    for (url, says) in [
        ("http://127.0.0.1:9100/ x", "not a valid URL"),
        ("http://127.0.0.1:9100/a\tb", "not a valid URL"),
        ("http://user:hunter2@api.example.com", "no user or password"),
        ("htps://user:hunter2@api.example.com", "no user or password"),
        (
            "http://user:hunter2@api.example.com/?x",
            "no user or password",
        ),
        (
            "http://user:hun/ter2@api.example.com",
            "no user or password",
        ),
    ] {
        let text = GOOD.replace("http://127.0.0.1:9100", url);
        let e = Config::parse(Path::new("c.toml"), &text).expect_err(url);
        let s = e.to_string();
        assert!(s.contains(says) && s.contains("c.toml:"), "{s}");
        assert!(!s.contains("hunter2") && !s.contains("ter2"), "{s}");
    }
}

#[test]
fn pass_headers_and_owned_by_are_checked_where_they_are_written() {
    let text = GOOD
        .replace(
            "name = \"local\"\n",
            "name = \"local\"\npass_headers = [\"openai-processing-ms\", \"set-cookie\"]\n",
        )
        .replace("pool = \"local\"\n", "pool = \"local\"\nowned_by = \"\"\n");
    let s = Config::parse(Path::new("c.toml"), &text)
        .expect_err("refused")
        .to_string();
    assert!(
        s.contains("c.toml:9: pools[0].pass_headers: 'set-cookie'"),
        "{s}"
    );
    assert!(s.contains("models[0].owned_by"), "{s}");
    let text = GOOD.replace(
        "name = \"local\"\n",
        "name = \"local\"\npass_headers = [\"OpenAI-Processing-Ms\", \"x-mock-*\"]\n",
    );
    let c = Config::parse(Path::new("c.toml"), &text).expect("valid");
    let pass = &c.live.pools[0].pass_headers;
    assert!(pass.allows("openai-processing-ms") && pass.allows("x-mock-model"));
    assert_eq!(c.live.models[0].owned_by, "modelgate");
}

/// Port 0 is a port the gateway picks at start (`server::ports`): any listener may ask for
/// one, each its own.
#[test]
fn port_0_is_taken_for_every_listener() {
    let text = GOOD
        .replace("127.0.0.1:8081", "127.0.0.1:0")
        .replace("127.0.0.1:8080", "127.0.0.1:0");
    let c = Config::parse(Path::new("c.toml"), &text).expect("port 0 twice");
    assert_eq!(c.fixed.listeners.main.as_deref(), Some("127.0.0.1:0"));
    assert_eq!(c.fixed.listeners.direct.as_deref(), Some("127.0.0.1:0"));
}

#[test]
fn unknown_fields_are_reported_with_line() {
    let text = GOOD.replace("[keys]", "[keys]\nfiel = 1");
    let e = Config::parse(Path::new("c.toml"), &text).expect_err("unknown field");
    let s = e.to_string();
    assert!(s.contains("c.toml:6"), "{s}");
    assert!(s.contains("fiel"), "{s}");
}

#[test]
fn listeners_on_one_port_are_told_apart_as_linux_binds_them() {
    let a = |s: &str| s.parse::<std::net::SocketAddr>().expect("addr");
    for (x, y, clash) in [
        ("127.0.0.1:80", "127.0.0.1:80", true),
        ("127.0.0.1:80", "127.0.0.1:81", false),
        ("0.0.0.0:80", "10.0.0.1:80", true),
        ("127.0.0.1:80", "10.0.0.1:80", false),
        // `0.0.0.0` is IPv4 only; `[::]` is dual-stack.
        ("0.0.0.0:80", "[::1]:80", false),
        ("[::]:80", "127.0.0.1:80", true),
        ("[::ffff:127.0.0.1]:80", "127.0.0.1:80", true),
    ] {
        assert_eq!(one_port(&a(x), &a(y)), clash, "{x} {y}");
        assert_eq!(one_port(&a(y), &a(x)), clash, "{y} {x}");
    }
}

#[test]
fn every_semantic_problem_is_reported() {
    let text = GOOD
        .replace("pool = \"local\"", "pool = \"nope\"")
        .replace("http://127.0.0.1:9100", "ftp://x");
    let e = Config::parse(Path::new("c.toml"), &text).expect_err("bad");
    assert_eq!(e.0.len(), 2, "{e}");
    let s = e.to_string();
    assert!(
        s.contains("models[0].pool") && s.contains("pools[0].upstreams"),
        "{s}"
    );
    // A query or fragment in a base URL would end up in the middle of each request's URL.
    for url in ["http://upstream?x=1", "https://upstream/base#f"] {
        let text = GOOD.replace("http://127.0.0.1:9100", url);
        let e = Config::parse(Path::new("c.toml"), &text).expect_err("bad");
        assert!(e.to_string().contains("no query or fragment"), "{e}");
    }
}

#[test]
fn new_sections_are_validated() {
    let with = |extra: &str| Config::parse(Path::new("c.toml"), &format!("{GOOD}\n{extra}"));
    let c = with("[telemetry]\notlp_endpoint = \"http://otel:4318\"\n[metrics]\nkey_label = true\n[limits]\nauth_failures_per_minute = 0\n").expect("valid");
    let t = c.fixed.telemetry.expect("telemetry");
    assert_eq!((t.service_name.as_str(), t.sample_rate), ("modelgate", 1.0));
    assert!(c.fixed.metrics.key_label);
    assert_eq!(c.fixed.limits.auth_failures_per_minute, 0);
    for (extra, field) in [
        ("[telemetry]\notlp_endpoint = \"otel:4318\"\n", "telemetry"),
        (
            "[telemetry]\notlp_endpoint = \"http://o\"\nsample_rate = 2.0\n",
            "telemetry",
        ),
    ] {
        let e = with(extra).expect_err(extra).to_string();
        assert!(e.contains(field), "{e}");
    }
    let bad_header = GOOD.replace(
        "name = \"local\"",
        "name = \"local\"\nauth_header = \"bearer\"",
    );
    let e = Config::parse(Path::new("c.toml"), &bad_header).expect_err("auth_header");
    assert!(e.to_string().contains("auth_header"), "{e}");
}

#[test]
fn fleet_settings_are_read_and_their_mistakes_named() {
    let with = |extra: &str| Config::parse(Path::new("c.toml"), &format!("{GOOD}\n{extra}"));
    let c = with(
        "[storage]\npostgres = \"postgres://mg@db:5432/mg\"\n[limits]\nredis = \"redis://cache:6379\"\n\
         on_redis_down = \"deny\"\nredis_timeout_ms = 50\n",
    )
    .expect("valid");
    assert_eq!(
        c.fixed.storage.postgres.as_ref().map(Secret::expose),
        Some("postgres://mg@db:5432/mg")
    );
    assert_eq!(
        c.fixed.limits.redis.as_ref().map(Secret::expose),
        Some("redis://cache:6379")
    );
    assert_eq!(c.fixed.limits.on_redis_down, super::OnDown::Deny);
    assert_eq!(c.fixed.limits.redis_timeout, Duration::from_millis(50));
    assert!(!c.fixed.keys.in_postgres);
    assert!(c.fixed.storage.spool.ends_with("usage-spool.jsonl"));
    assert_eq!(
        (
            c.fixed.storage.on_store_full,
            c.fixed.storage.memory_max_records,
            c.fixed.storage.spool_max_bytes
        ),
        (OnStoreFull::Refuse, 200_000, 1 << 30)
    );
    let c = with(
        "[storage]\non_store_full = \"serve\"\nmemory_max_records = 10\nspool_max_bytes = 4096\n",
    )
    .expect("valid");
    assert_eq!(
        (
            c.fixed.storage.on_store_full,
            c.fixed.storage.memory_max_records,
            c.fixed.storage.spool_max_bytes
        ),
        (OnStoreFull::Serve, 10, 4096)
    );
    // The secrets never show in Debug.
    let dbg = format!("{c:?}");
    assert!(
        !dbg.contains("mg@db") && !dbg.contains("cache:6379"),
        "{dbg}"
    );
    let keys_pg = GOOD.replace("[keys]", "[keys]\nsource = \"postgres\"");
    let c = Config::parse(
        Path::new("c.toml"),
        &format!("{keys_pg}\n[storage]\npostgres = \"host=/tmp user=mg\"\n"),
    )
    .expect("key=value settings");
    assert!(c.fixed.keys.in_postgres);
    for (extra, field, says) in [
        (
            "[storage]\nsqlite = \"u.db\"\npostgres = \"postgres://db/mg\"\n",
            "storage.postgres",
            "not both",
        ),
        (
            "[storage]\npostgres = \"postgres://db:notaport/mg\"\n",
            "storage.postgres",
            "connection string",
        ),
        (
            "[storage]\npostgres = \"env:MG_TEST_UNSET_PG_VAR\"\n",
            "storage.postgres",
            "is not set",
        ),
        (
            "[limits]\nredis = \"http://cache\"\n",
            "limits.redis",
            "redis://",
        ),
        (
            "[limits]\non_redis_down = \"maybe\"\n",
            "limits.on_redis_down",
            "\"local\" or \"deny\"",
        ),
        (
            "[storage]\non_store_full = \"drop\"\n",
            "storage.on_store_full",
            "\"refuse\" or \"serve\"",
        ),
    ] {
        let e = with(extra).expect_err(extra).to_string();
        assert!(e.contains(field) && e.contains(says), "{extra}: {e}");
    }
    let e = Config::parse(Path::new("c.toml"), &keys_pg).expect_err("no postgres");
    assert!(e.to_string().contains("needs [storage] postgres"), "{e}");
    let bad = GOOD.replace("[keys]", "[keys]\nsource = \"etcd\"");
    let e = Config::parse(Path::new("c.toml"), &bad).expect_err("unknown source");
    assert!(e.to_string().contains("keys.source"), "{e}");
}

#[test]
fn a_pools_provider_native_apis_and_drop_params_are_checked() {
    let with = |lines: &str| {
        GOOD.replace(
            "name = \"local\"\n",
            &format!("name = \"local\"\n{lines}\n"),
        )
    };
    let c = Config::parse(Path::new("c.toml"), &with("provider = \"anthropic\"")).expect("valid");
    assert_eq!(c.live.pools[0].provider, Provider::Anthropic);
    assert_eq!(c.live.pools[0].auth_header, AuthHeader::XApiKey);
    assert!(c.live.pools[0].native.passes(Api::Messages));
    assert!(!c.live.pools[0].native.passes(Api::Chat));
    let c = Config::parse(
        Path::new("c.toml"),
        &with("drop_params = [\"temperature\"]"),
    )
    .expect("valid");
    assert_eq!(c.live.pools[0].drop_params, ["temperature"]);
    for (lines, says) in [
        ("provider = \"gemini\"", "not supported yet"),
        ("provider = \"acme\"", "not one of openai, anthropic"),
        (
            "native = [\"chatt\"]",
            "'chatt' is not one of chat, completions",
        ),
        (
            "provider = \"anthropic\"\nnative = [\"chat\"]",
            "speaks only the Messages API",
        ),
        (
            "drop_params = [\"max_tokens\"]",
            "'max_tokens' is not a parameter a translation refuses: one of temperature",
        ),
    ] {
        let e = Config::parse(Path::new("c.toml"), &with(lines)).expect_err(lines);
        assert!(e.to_string().contains(says), "{lines}: {e}");
    }
}
