//! Model routing as tools name models: glob entries (the id asked for goes upstream, or a
//! `{model}` template), aliases, and default models (a key's, then `[routing]`'s) for ids no
//! entry matches; `/v1/models` lists names and aliases, never a glob.

mod common;

use common::*;
use serde_json::Value;

const ROUTES: &str = r#"
[[models]]
name = "claude-*"
pool = "local"
aliases = ["claude-latest"]
owned_by = "anthropic"

[[models]]
name = "gpt-4o-*"
pool = "local"
upstream_model = "openai/{model}"

[[models]]
name = "sonnet"
pool = "local"
upstream_model = "claude-sonnet-4-20250514"
aliases = ["claude-sonnet-latest", "best"]

[routing]
default_model = "echo-1"
"#;

const ROUTING_KEYS: &str = r#"
[[keys]]
id = "defaulted"
secret = "sk-test-defaulted-0090"
default_model = "sonnet"

[[keys]]
id = "claude-only"
secret = "sk-test-claude-only-0091"
models = ["claude-*"]
"#;

fn setup() -> Setup {
    Setup {
        extra_config: ROUTES.into(),
        extra_keys: ROUTING_KEYS.into(),
        ..Setup::default()
    }
}

/// A chat request for `model` with `key`: (status, the model the upstream was asked for,
/// the request id).
async fn chat_as(g: &Gateway, key: &str, model: &str) -> (u16, String, String) {
    let resp = send(
        &g.main,
        "/v1/chat/completions",
        Some(key),
        &chat_body(model, false),
        &[],
    )
    .await;
    let status = resp.status().as_u16();
    let upstream = resp
        .headers()
        .get("x-mock-model")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, upstream, request_id(&resp))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_glob_entry_sends_the_id_asked_for_or_its_template_and_records_that_id() {
    let g = start_with(setup());
    let (status, upstream, id) = chat_as(&g, KEY, "claude-3-7-sonnet-20250219").await;
    assert_eq!(
        (status, upstream.as_str()),
        (200, "claude-3-7-sonnet-20250219")
    );
    let record = await_record(&g, &id).await;
    assert_eq!(record["model"], "claude-3-7-sonnet-20250219");
    // The model served is that id too, not the entry's pattern.
    assert_eq!(record["served_model"], "claude-3-7-sonnet-20250219");
    let (status, upstream, _) = chat_as(&g, KEY, "gpt-4o-mini").await;
    assert_eq!((status, upstream.as_str()), (200, "openai/gpt-4o-mini"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alias_reaches_its_model_and_is_recorded_as_it() {
    let g = start_with(setup());
    for alias in ["claude-sonnet-latest", "best"] {
        let (status, upstream, id) = chat_as(&g, KEY, alias).await;
        assert_eq!(
            (status, upstream.as_str()),
            (200, "claude-sonnet-4-20250514"),
            "{alias}"
        );
        assert_eq!(await_record(&g, &id).await["model"], "sonnet", "{alias}");
    }
    // An alias of a glob entry: the alias is the id served.
    let (status, upstream, _) = chat_as(&g, KEY, "claude-latest").await;
    assert_eq!((status, upstream.as_str()), (200, "claude-latest"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_id_takes_the_keys_default_then_the_global_one() {
    let g = start_with(setup());
    let defaulted = "sk-test-defaulted-0090";
    let (status, upstream, id) = chat_as(&g, defaulted, "no-such-model").await;
    assert_eq!(
        (status, upstream.as_str()),
        (200, "claude-sonnet-4-20250514")
    );
    let within = std::time::Duration::from_secs(5);
    let record = await_key_record(&client(), &g.direct, defaulted, &id, within).await;
    assert_eq!(record["model"], "sonnet");
    let (status, upstream, id) = chat_as(&g, KEY, "no-such-model").await;
    assert_eq!((status, upstream.as_str()), (200, "echo-1"));
    assert_eq!(await_record(&g, &id).await["model"], "echo-1");
    // A default the key may not use is refused, not a way around its allow-list.
    let (status, _, _) = chat_as(&g, "sk-test-claude-only-0091", "no-such-model").await;
    assert_eq!(status, 403);
    let (status, _, _) = chat_as(&g, "sk-test-claude-only-0091", "claude-opus-4").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_default_an_unknown_id_is_404() {
    let g = start_with(Setup {
        extra_config: ROUTES.replace("[routing]\ndefault_model = \"echo-1\"\n", ""),
        ..Setup::default()
    });
    let (status, body) = error_of(
        send(
            &g.main,
            "/v1/chat/completions",
            Some(KEY),
            &chat_body("no-such-model", false),
            &[],
        )
        .await,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(body["code"], "model_not_found");
}

/// The ids `GET /v1/models` lists for `key`.
async fn listed(g: &Gateway, key: &str) -> Vec<String> {
    let list: Value = get(&g.main, "/v1/models", Some(key))
        .await
        .json()
        .await
        .expect("json");
    let data = list["data"].as_array().cloned().unwrap_or_default();
    data.iter()
        .filter_map(|m| m["id"].as_str().map(String::from))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_model_list_names_entries_and_aliases_never_a_glob() {
    let g = start_with(setup());
    let ids = listed(&g, KEY).await;
    for want in [
        "echo-1",
        "claude-latest",
        "sonnet",
        "claude-sonnet-latest",
        "best",
    ] {
        assert!(ids.iter().any(|id| id == want), "{want} in {ids:?}");
    }
    assert!(!ids.iter().any(|id| id.contains('*')), "{ids:?}");
    // One glob-matched id can be looked up; its owner is the entry's.
    let one: Value = get(&g.main, "/v1/models/claude-opus-4", Some(KEY))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(
        (one["id"].as_str(), one["owned_by"].as_str()),
        (Some("claude-opus-4"), Some("anthropic"))
    );
    // A key limited to claude-* sees only those.
    let ids = listed(&g, "sk-test-claude-only-0091").await;
    assert_eq!(ids, ["claude-latest", "claude-sonnet-latest"]);
}

#[test]
fn check_names_aliases_that_collide_globs_that_do_not_parse_and_an_unknown_default() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("keys.toml"), "").expect("keys");
    let config = dir.path().join("modelgate.toml");
    std::fs::write(
        &config,
        r#"[listeners]
main = "127.0.0.1:0"
[keys]
file = "keys.toml"
[[pools]]
name = "p"
upstreams = ["http://127.0.0.1:9"]
[[models]]
name = "a"
pool = "p"
aliases = ["b", "c*"]
[[models]]
name = "b"
pool = "p"
[[models]]
name = "x[-"
pool = "p"
[routing]
default_model = "nothing"
"#,
    )
    .expect("config");
    let out = std::process::Command::new(bin())
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .expect("check");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    for want in [
        "models[0].aliases: alias 'c*' is a glob",
        "alias 'b' is already a model's name or alias",
        "models[2].name: bad glob 'x[-'",
        "routing.default_model: 'nothing' is not a configured model",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
}
