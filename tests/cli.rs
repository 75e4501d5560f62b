//! The commands of the contract: plain `modelgate`, `check`, `key new`, `password-hash`.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;

fn run(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `modelgate check --config path`: (exit code, stdout, stderr).
fn check(path: &std::path::Path) -> (i32, String, String) {
    run(&["check", "--config", path.to_str().expect("utf-8")], None)
}

#[test]
fn check_accepts_the_shipped_demo_config() {
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/modelgate.toml");
    let (code, out, err) = run(&["check", "--config", conf], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok"), "{out}");
}

#[test]
fn check_names_every_problem_with_file_line_and_field() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = r#"[listeners]
main = "127.0.0.1:1"

[keys]
file = "keys.toml"

[[pools]]
name = "p"
upstreams = ["ftp://nowhere"]

[[models]]
name = "m"
pool = "missing"
"#;
    std::fs::write(dir.path().join("modelgate.toml"), config).expect("write");
    let keys = "[[keys]]\nid = \"a\"\nsecret = \"sk-aaaaaaaaaaa\"\nendpoints = [\"chat\", \"files\"]\nmodels = [\"[oops\"]\n\n[[keys]]\nid = \"a\"\nsecret = \"sk-bbbbbbbbbbb\"\n";
    std::fs::write(dir.path().join("keys.toml"), keys).expect("write");
    let path = dir.path().join("modelgate.toml");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    for needle in [
        "modelgate.toml:9: pools[0].upstreams",
        "modelgate.toml:13: models[0].pool",
        "keys.toml:4: keys[0].endpoints",
        "keys.toml:5: keys[0].models",
        "keys.toml:8: keys[1].id",
    ] {
        assert!(err.contains(needle), "missing `{needle}` in:\n{err}");
    }
    // A config that is not even TOML (an unclosed string): the keys file it names is checked
    // all the same.
    std::fs::write(
        &path,
        "[listeners]\nmain = \"127.0.0.1:1\n\n[keys]\nfile = \"keys.toml\"\n",
    )
    .expect("write");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    assert!(err.contains("modelgate.toml:2"), "{err}");
    assert!(err.contains("keys.toml:8: keys[1].id"), "{err}");
}

/// A usage store `serve` could not open (a folder, a file that is no database) is named by
/// `check` too, which writes nothing; a store still to be made passes.
#[test]
fn check_names_a_usage_store_that_cannot_be_opened() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("k.toml"), "").expect("write");
    std::fs::write(
        dir.path().join("notes.txt"),
        "not a database, but long enough to be read as one",
    )
    .expect("write");
    std::fs::create_dir(dir.path().join("folder")).expect("mkdir");
    let path = dir.path().join("c.toml");
    for (store, ok) in [
        ("folder", false),
        ("notes.txt", false),
        ("new/usage.db", true),
        ("notes.txt/usage.db", false),
    ] {
        let config = format!(
            "[listeners]\nmain = \"127.0.0.1:1\"\n[keys]\nfile = \"k.toml\"\n[storage]\nsqlite = \"{store}\"\n"
        );
        std::fs::write(&path, config).expect("write");
        let (code, out, err) = check(&path);
        assert_eq!(code == 0, ok, "{store}: {out}{err}");
        if !ok {
            assert!(err.contains("c.toml: storage.sqlite"), "{store}: {err}");
        }
    }
    assert!(!dir.path().join("new").exists(), "check wrote nothing");
    // Named beside the config's other problems too.
    std::fs::write(
        &path,
        "[listeners]\nmain = \"127.0.0.1:1\"\n[keys]\nfile = \"k.toml\"\n[storage]\nsqlite = \"folder\"\n[server]\ngrace_period_seconds = 9223372036854775807\n",
    )
    .expect("write");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    assert!(
        err.contains("storage.sqlite") && err.contains("grace_period_seconds"),
        "{err}"
    );
}

/// Values that would break the gateway at run time are refused by `check` (and `serve`): a
/// duration past a week (a grace period near u64::MAX panicked at shutdown), a price that
/// makes a cost infinite, a model name longer than a request may give.
#[test]
fn check_refuses_durations_prices_and_names_out_of_range() {
    let dir = tempfile::tempdir().expect("tmp");
    let long = "m".repeat(300);
    let config = format!(
        "[listeners]\nmain = \"127.0.0.1:1\"\n[keys]\nfile = \"k.toml\"\n[server]\n\
         grace_period_seconds = 9223372036854775807\ntrusted_proxies = [\"10.0.0.0/40\"]\n\n\
         [[pools]]\nname = \"p\"\n\
         upstreams = [\"http://127.0.0.1:1\"]\ncooldown_ms = 9223372036854775807\n\n\
         [[models]]\nname = \"{long}\"\npool = \"p\"\n\
         price = {{ prompt = 1e300, completion = 1.0 }}\n\n[storage]\nretention_days = 99999999999\n"
    );
    std::fs::write(dir.path().join("c.toml"), config).expect("write");
    std::fs::write(dir.path().join("k.toml"), "").expect("write");
    let path = dir.path().join("c.toml");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    for needle in [
        "c.toml:6: grace_period_seconds",
        "more than a week",
        "c.toml:7: server.trusted_proxies: '10.0.0.0/40'",
        "c.toml:12: cooldown_ms",
        "c.toml:15: models[0].name: longer than 256 bytes",
        "c.toml:17: models[0].price",
        "retention_days",
        "more than a hundred years",
    ] {
        assert!(err.contains(needle), "missing `{needle}` in:\n{err}");
    }
}

#[test]
fn check_reports_an_unknown_field_with_its_line() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(
        dir.path().join("c.toml"),
        "[listeners]\nmain = \"127.0.0.1:1\"\nmian = \"x\"\n[keys]\nfile = \"k.toml\"\n",
    )
    .expect("write");
    let path = dir.path().join("c.toml");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    assert!(err.contains("c.toml:3") && err.contains("mian"), "{err}");
}

/// Unknown fields and values of the wrong type do not hide one another, nor the keys file's
/// problems, nor the problems of the values that were right in shape.
#[test]
fn check_names_every_unknown_field_and_wrong_type_in_both_files() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = "[listeners]\nmian = \"127.0.0.1:1\"\nmain = \"127.0.0.1:1\"\n[keys]\nfile = \"k.toml\"\n\n\
        [[pools]]\nname = \"p\"\nupstreams = [{ url = \"http://127.0.0.1:1\", wieght = 2 }]\n\
        max_attempts = \"three\"\n\n[[models]]\nname = \"m\"\npool = \"nowhere\"\n";
    std::fs::write(dir.path().join("c.toml"), config).expect("write");
    let keys =
        "[[keys]]\nid = \"a\"\nsecret = \"sk-aaaaaaaaaaa\"\nrpm = \"many\"\nmodles = [\"m\"]\n";
    std::fs::write(dir.path().join("k.toml"), keys).expect("write");
    let path = dir.path().join("c.toml");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    assert!(!err.contains("missing field"), "{err}");
    for needle in [
        "c.toml:2: mian",
        "c.toml:9: upstreams: an upstream is a URL string or a table",
        "c.toml:10: max_attempts",
        "c.toml:14: models[0].pool",
        "k.toml:4: rpm",
        "k.toml:5: modles",
    ] {
        assert!(err.contains(needle), "missing `{needle}` in:\n{err}");
    }
}

/// A required field of the wrong type does not end the search (a stand-in of its type takes
/// its place), two listeners (or a listener and the demo upstream) on one port, both of
/// `[telemetry]`'s problems, an upstream that does not resolve: all named with their lines in
/// one run, with the keys file's.
#[test]
fn check_goes_on_past_a_required_field_of_the_wrong_type_and_names_what_serve_would_refuse() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = "[listeners]\nmain = \"127.0.0.1:7001\"\ndirect = \"0.0.0.0:7001\"\n\
        [keys]\nfile = \"k.toml\"\n\
        [[pools]]\nname = 5\nupstreams = [\"http://127.0.0.1:1\"]\n\
        [[pools]]\nname = \"q\"\nupstreams = [\"http://no-such-host.invalid\"]\nstrategy = \"nope\"\n\
        [[models]]\nname = \"m\"\npool = \"nowhere\"\n\
        [telemetry]\notlp_endpoint = \"not a url\"\nsample_rate = 2\n\
        [demo]\nmock_upstream = \"127.0.0.1:7001\"\n";
    std::fs::write(dir.path().join("c.toml"), config).expect("write");
    std::fs::write(
        dir.path().join("k.toml"),
        "[[keys]]\nid = 5\nsecret = \"sk-aaaaaaaaaaa\"\n[[keys]]\nid = \"b\"\nsecret = \"short\"\n",
    )
    .expect("write");
    let path = dir.path().join("c.toml");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    assert!(!err.contains("missing field"), "{err}");
    for needle in [
        "c.toml:3: listeners.direct: 0.0.0.0:7001 is also `listeners.main`'s",
        "c.toml:7: name: invalid type",
        "c.toml:11: pools.q.upstreams: cannot resolve",
        "c.toml:12: pools[1].strategy",
        "c.toml:15: models[0].pool",
        "c.toml:17: telemetry.otlp_endpoint",
        "c.toml:18: telemetry.sample_rate",
        "c.toml:20: demo.mock_upstream: 127.0.0.1:7001 is also `listeners.main`'s",
        "k.toml:2: id: invalid type",
        "k.toml:6: keys[1].secret",
    ] {
        assert!(err.contains(needle), "missing `{needle}` in:\n{err}");
    }
    // The stand-in's own follow-on ("empty pool name") is not named.
    assert!(!err.contains("empty pool name"), "{err}");

    // A config that does not deserialize at all (no `[listeners]`): the keys file it names is
    // still checked.
    std::fs::write(&path, "[keys]\nfile = \"k.toml\"\n").expect("write");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    assert!(err.contains("listeners"), "{err}");
    assert!(err.contains("k.toml:6: keys[1].secret"), "{err}");
}

#[test]
fn check_refuses_a_console_password_hash_that_is_not_argon2id() {
    let (_, argon2id, _) = run(&["password-hash"], Some("pw\n"));
    let argon2i = argon2id.trim().replace("$argon2id$", "$argon2i$");
    for (hash, ok) in [
        (argon2id.trim().to_string(), true),
        ("hunter2".to_string(), false),
        ("$2b$12$abcdefghijklmnopqrstuu".to_string(), false),
        (argon2i, false),
        // argon2id in name only: no parameters, salt or hash.
        ("$argon2id$garbage".to_string(), false),
        (
            "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ".to_string(),
            false,
        ),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(
            dir.path().join("k.toml"),
            "[[keys]]\nid = \"a\"\nsecret = \"sk-aaaaaaaa\"\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("c.toml"),
            format!(
                "[listeners]\nmain = \"127.0.0.1:1\"\n[keys]\nfile = \"k.toml\"\n\
                 [console]\nuser = \"admin\"\npassword_hash = \"{hash}\"\n"
            ),
        )
        .expect("write");
        let path = dir.path().join("c.toml");
        let (code, _, err) = check(&path);
        assert_eq!(code == 0, ok, "{hash}: {err}");
        if !ok {
            assert!(
                err.contains("c.toml:7: console.password_hash") && err.contains("argon2id"),
                "{err}"
            );
        }
    }
}

#[test]
fn check_names_the_field_of_a_type_error() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(
        dir.path().join("k.toml"),
        "[[keys]]\nid = \"a\"\nsecret = \"sk-aaaaaaaa\"\nrpm = \"lots\"\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("c.toml"),
        "[listeners]\nmain = \"127.0.0.1:1\"\n[keys]\nfile = \"k.toml\"\n",
    )
    .expect("write");
    let path = dir.path().join("c.toml");
    let (code, _, err) = check(&path);
    assert_ne!(code, 0);
    assert!(err.contains("k.toml:4: rpm: invalid type"), "{err}");
}

/// A RUST_LOG directive that does not parse is named, and the others stay in force (one typo
/// dropped them all, silently).
#[test]
fn a_bad_rust_log_directive_is_named_and_the_rest_kept() {
    let out = Command::new(bin())
        .args(["key", "new"])
        .env("RUST_LOG", "error,pingora=nonsense")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success());
    // Said even though the filter lets no warning through.
    assert!(err.contains("RUST_LOG: a directive left out"), "{err}");
}

#[test]
fn key_new_prints_a_fresh_key_and_an_entry_with_only_its_hash() {
    let (code, out, _) = run(&["key", "new", "--id", "ci-bot"], None);
    assert_eq!(code, 0);
    let secret = out.lines().next().expect("first line");
    assert!(secret.starts_with("sk-") && secret.len() == 51, "{secret}");
    assert!(
        secret[3..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    );
    assert!(out.contains("id = \"ci-bot\""));
    assert!(out.contains(&format!(
        "secret_sha256 = \"{}\"",
        sha256_hex(secret.as_bytes())
    )));
    assert_eq!(
        out.matches(secret).count(),
        1,
        "the entry must not hold the secret"
    );
    let (_, again, _) = run(&["key", "new"], None);
    assert_ne!(again.lines().next(), Some(secret));
    // An entry the keys file would refuse is never printed.
    let (code, out, err) = run(&["key", "new", "--id", ""], None);
    assert_ne!(code, 0);
    assert!(
        out.is_empty() && err.contains("cannot be empty"),
        "{out} {err}"
    );
}

#[test]
fn key_new_appends_its_entry_to_a_keys_file_keeping_comments_and_prints_only_the_secret() {
    let dir = tempfile::tempdir().expect("tmp");
    let keys = dir.path().join("keys.toml");
    std::fs::write(
        &keys,
        format!(
            "# team keys, edited by hand\n[[keys]]\nid = \"a\"\nsecret_sha256 = \"{}\"\n",
            "0".repeat(64)
        ),
    )
    .expect("write");
    let path = keys.to_str().expect("utf-8");
    let (code, out, err) = run(
        &["key", "new", "--id", "b \"quoted\"", "--append", path],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let secret = out.trim();
    assert!(
        secret.starts_with("sk-") && out.lines().count() == 1,
        "{out}"
    );
    let text = std::fs::read_to_string(&keys).expect("read");
    assert!(text.starts_with("# team keys, edited by hand"), "{text}");
    assert!(text.contains(&sha256_hex(secret.as_bytes())), "{text}");
    assert!(!text.contains(secret), "the file must not hold the secret");
    let parsed: toml::Value = toml::from_str(&text).expect("valid TOML");
    assert_eq!(parsed["keys"][1]["id"].as_str(), Some("b \"quoted\""));
    // The same id again is refused, the file untouched.
    let (code, _, err) = run(&["key", "new", "--id", "a", "--append", path], None);
    assert_ne!(code, 0);
    assert!(err.contains("exists"), "{err}");
    assert_eq!(std::fs::read_to_string(&keys).expect("read"), text);
    // Without --append, any id still makes an entry that parses.
    let (_, out, _) = run(&["key", "new", "--id", "x\"y"], None);
    let entry: String = out.lines().skip(2).map(|l| format!("{l}\n")).collect();
    let parsed: toml::Value = toml::from_str(&entry).expect("valid TOML");
    assert_eq!(parsed["keys"][0]["id"].as_str(), Some("x\"y"));
}

#[test]
fn password_hash_prints_an_argon2id_hash() {
    let (code, out, _) = run(&["password-hash"], Some("correct horse\n"));
    assert_eq!(code, 0);
    assert!(out.trim().starts_with("$argon2id$v=19$"), "{out}");
    let (code, _, err) = run(&["password-hash"], Some(""));
    assert_ne!(code, 0, "{err}");
}

#[test]
fn serve_exits_with_an_error_when_a_listen_port_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tmp");
    let config =
        format!("[listeners]\nmain = \"127.0.0.1:{port}\"\n[keys]\nfile = \"keys.toml\"\n");
    std::fs::write(dir.path().join("c.toml"), config).expect("write");
    std::fs::write(dir.path().join("keys.toml"), "").expect("write");
    let path = dir.path().join("c.toml");
    let (code, _, err) = run(&["serve", "--config", path.to_str().expect("utf-8")], None);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{err}"
    );
}

/// A trust store for TLS upstreams that cannot be loaded (here `SSL_CERT_FILE` naming a bundle
/// whose certificate is no certificate) stops the start with the file named, instead of a
/// panic in Pingora's connector.
#[test]
fn serve_exits_with_an_error_when_the_trust_store_cannot_be_loaded() {
    let dir = tempfile::tempdir().expect("tmp");
    let port = free_port();
    let config =
        format!("[listeners]\nmain = \"127.0.0.1:{port}\"\n[keys]\nfile = \"keys.toml\"\n");
    std::fs::write(dir.path().join("c.toml"), config).expect("write");
    std::fs::write(dir.path().join("keys.toml"), "").expect("write");
    let bundle = dir.path().join("bundle.pem");
    std::fs::write(
        &bundle,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .expect("write");
    // `serve` or `check` with the bundle as the trust store: (exit code, stderr).
    let with_bundle = |command: &str| {
        let out = Command::new(bin())
            .args([command, "--config"])
            .arg(dir.path().join("c.toml"))
            .env("SSL_CERT_FILE", &bundle)
            .output()
            .expect(command);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = with_bundle("serve");
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("trust store for TLS upstreams"), "{err}");
    assert!(err.contains(&bundle.display().to_string()), "{err}");
    // `check` names it too: `serve` would not start.
    let (code, err) = with_bundle("check");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("SSL_CERT_FILE"), "{err}");
    assert!(err.contains("trust store for TLS upstreams"), "{err}");
}

/// Two addresses of the config naming one port (here the demo mock and `main`) stop the start
/// with the port named, instead of one answering on the other's port: the config is refused
/// before anything binds.
#[test]
fn serve_exits_with_an_error_when_two_addresses_are_one_port() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let dir = tempfile::tempdir().expect("tmp");
    let config = format!(
        "[listeners]\nmain = \"127.0.0.1:{port}\"\n[keys]\nfile = \"keys.toml\"\n[demo]\nmock_upstream = \"127.0.0.1:{port}\"\n"
    );
    std::fs::write(dir.path().join("c.toml"), config).expect("write");
    std::fs::write(dir.path().join("keys.toml"), "").expect("write");
    let path = dir.path().join("c.toml");
    let (code, _, err) = run(&["serve", "--config", path.to_str().expect("utf-8")], None);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&format!(
            "demo.mock_upstream: 127.0.0.1:{port} is also `listeners.main`'s"
        )),
        "{err}"
    );
}

/// Plain `modelgate` is `serve` with `conf/modelgate.toml` of its working directory.
#[test]
fn plain_modelgate_serves_the_default_config_of_its_working_directory() {
    use std::io::Read;
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::create_dir(dir.path().join("conf")).expect("conf");
    let (main, admin) = (free_port(), free_port());
    std::fs::write(
        dir.path().join("conf/modelgate.toml"),
        format!(
            "[listeners]\nmain = \"127.0.0.1:{main}\"\nadmin = \"127.0.0.1:{admin}\"\n\
             [keys]\nfile = \"keys.toml\"\n[storage]\nsqlite = \"usage.db\"\n"
        ),
    )
    .expect("write");
    std::fs::write(
        dir.path().join("conf/keys.toml"),
        "[[keys]]\nid = \"a\"\nsecret = \"sk-plain-modelgate-key\"\n",
    )
    .expect("write");
    let mut child = Command::new(bin())
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let get = |port: u16, path: &str| -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .ok()?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-plain-modelgate-key\r\n\
             Connection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    // Each listener is bound by its own service's thread as the gateway starts, so each is
    // awaited on its own: admin answering says nothing of main yet. (A connect to a port
    // nothing listens on may connect to itself and read its own request back: not an answer.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let answer = |port: u16, path: &str| loop {
        match get(port, path).filter(|r| r.starts_with("HTTP/")) {
            Some(r) => break Some(r),
            None if std::time::Instant::now() > deadline => break None,
            None => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    let health = answer(admin, "/healthz");
    let models = answer(main, "/v1/models");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        health.is_some_and(|h| h.starts_with("HTTP/1.1 200")),
        "never healthy"
    );
    let models = models.unwrap_or_default();
    assert!(models.starts_with("HTTP/1.1 200"), "{models}");
    assert!(
        dir.path().join("conf/usage.db").exists(),
        "the store is the config's"
    );
}

/// At RUST_LOG=trace with the log kept in the config's folder (`2>> conf/stderr.log`), the
/// file watcher's own trace of each write to the log was another write: the log fed itself.
#[test]
fn a_trace_log_kept_beside_the_config_does_not_feed_itself() {
    let dir = tempfile::tempdir().expect("tmp");
    let port = || common::free_port();
    let config = format!(
        "[listeners]\nmain = \"127.0.0.1:{}\"\ndirect = \"127.0.0.1:{}\"\nadmin = \"127.0.0.1:{}\"\n\
         [keys]\nfile = \"keys.toml\"\n[storage]\nsqlite = \"usage.db\"\n\
         [[pools]]\nname = \"p\"\nupstreams = [\"http://127.0.0.1:1\"]\nhealth_interval_ms = 0\n\
         [[models]]\nname = \"m\"\npool = \"p\"\n",
        port(),
        port(),
        port()
    );
    std::fs::write(dir.path().join("modelgate.toml"), config).expect("config");
    std::fs::write(dir.path().join("keys.toml"), "").expect("keys");
    let log = dir.path().join("stderr.log");
    let mut child = std::process::Command::new(common::bin())
        .args(["serve", "--config"])
        .arg(dir.path().join("modelgate.toml"))
        .env("RUST_LOG", "trace")
        .stderr(std::fs::File::create(&log).expect("log"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("serve");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    common::eventually(std::time::Duration::from_secs(20), "never started", || {
        let text = read();
        if text.contains("modelgate starting") {
            Ok(())
        } else {
            Err(text)
        }
    });
    // A second of the gateway idle, with the watcher on.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let _ = child.kill();
    let _ = child.wait();
    let text = read();
    let watcher_lines = text.lines().filter(|l| l.contains("notify")).count();
    assert_eq!(watcher_lines, 0, "{} bytes of log", text.len());
}

/// A SIGHUP while the gateway starts (a config manager's reload racing a restart) ends nothing:
/// signals sent from the first log line on, until it answers, leave it serving.
#[test]
fn a_sighup_during_the_start_does_not_end_the_process() {
    let dir = tempfile::tempdir().expect("tmp");
    let (main, admin) = (free_port(), free_port());
    let config = format!(
        "[listeners]\nmain = \"127.0.0.1:{main}\"\nadmin = \"127.0.0.1:{admin}\"\n\
         [keys]\nfile = \"keys.toml\"\n[storage]\nsqlite = \"usage.db\"\n"
    );
    std::fs::write(dir.path().join("modelgate.toml"), config).expect("config");
    std::fs::write(
        dir.path().join("keys.toml"),
        "[[keys]]\nid = \"a\"\nsecret = \"sk-sighup-start-key\"\n",
    )
    .expect("keys");
    let log = dir.path().join("stderr.log");
    let mut child = Command::new(bin())
        .args(["serve", "--config"])
        .arg(dir.path().join("modelgate.toml"))
        .stderr(std::fs::File::create(&log).expect("log"))
        .stdout(Stdio::null())
        .spawn()
        .expect("serve");
    let pid = child.id().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("modelgate starting")
    {
        assert!(std::time::Instant::now() < deadline, "never started");
        assert!(child.try_wait().expect("wait").is_none(), "exited");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut sent = 0;
    let healthy = loop {
        let _ = Command::new("kill").args(["-HUP", &pid]).status();
        sent += 1;
        if child.try_wait().expect("wait").is_some() {
            break false;
        }
        // (A connect that reached itself is no listener.)
        if std::net::TcpStream::connect(("127.0.0.1", admin))
            .is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
        {
            break true;
        }
        assert!(std::time::Instant::now() < deadline, "never healthy");
    };
    let exited = child.try_wait().expect("wait");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        healthy && exited.is_none(),
        "ended by SIGHUP number {sent}: {exited:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
