"""The coding agents, unchanged, through the gateway's translated pools: Claude Code (the
Messages API, with its own tools and context management), Codex (the Responses API, with
its function, namespace and hosted tools) and aider (Chat Completions or the Messages API,
through litellm), each with its default model (mapped by the config's globs: `claude-*` to
the Anthropic-speaking pool, `gpt-*` to the chat-only pool) and with the other pool's model.
Claude Code and Codex from npm, installed in tests/node; aider from PyPI, in .venv-aider (it
pins its own openai and litellm)."""

import datetime
import os
import subprocess
import time

import pytest

from harness import FULL_KEY, MOCK_REPLY, REPO_ROOT

BIN = REPO_ROOT / "tests/node/node_modules/.bin"
AIDER = REPO_ROOT / ".venv-aider/bin/aider"
NODE_PATH = f"{BIN}:{os.environ.get('PATH', '')}"


def run(argv, env, home):
    env = {"PATH": NODE_PATH, "HOME": str(home), **env}
    done = subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr


def now() -> str:
    """The time as records state it (ISO 8601, milliseconds, UTC): they compare as strings."""
    t = datetime.datetime.now(datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def records_where(gateway, endpoint, since, wanted):
    """The key's records of `endpoint` from `since` on once one is `wanted` (records are
    written in batches), or all of them after 10 s."""
    import json
    import urllib.request
    url = gateway.base_url("direct").removesuffix("/v1") + "/api/usage?limit=1000&order=desc"
    deadline = time.monotonic() + 10
    while True:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {FULL_KEY}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            recs = [x for x in json.loads(r.read())["data"]
                    if x["endpoint"] == endpoint and x["time"] >= since]
        if any(wanted(x) for x in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.1)


def answers(gateway, home, argv, env, endpoint, served):
    """Runs the agent: it must print the mock's reply, and leave a record of `endpoint` that
    is `served`."""
    since = now()
    code, out = run(argv, env, home)
    assert code == 0 and MOCK_REPLY in out, out[-2000:]
    recs = records_where(gateway, endpoint, since, served)
    assert any(served(r) for r in recs), recs[:5]


@pytest.mark.parametrize("model", [None, "gpt-5.1"])
def test_claude_code_answers_through_the_gateway(gateway, tmp_path, model):
    claude = BIN / "claude"
    if not claude.exists():
        pytest.fail("tests/node is not installed: run scripts/install-deps.sh --test")
    env = {"ANTHROPIC_BASE_URL": gateway.base_url("main").removesuffix("/v1"),
           "ANTHROPIC_API_KEY": FULL_KEY, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1"}
    argv = [str(claude), "-p", "say hello"] + (["--model", model] if model else [])
    answers(gateway, tmp_path, argv, env, "messages",
            lambda r: r["model"].startswith(model or "claude-") and r["status"] == 200)


@pytest.mark.parametrize("model", [None, "claude-sonnet-5-5"])
def test_codex_answers_through_the_gateway(gateway, tmp_path, model):
    codex = BIN / "codex"
    if not codex.exists():
        pytest.fail("tests/node is not installed: run scripts/install-deps.sh --test")
    (tmp_path / "config.toml").write_text(
        'model_provider = "modelgate"\n'
        '[model_providers.modelgate]\nname = "modelgate"\n'
        f'base_url = "{gateway.base_url("main")}"\n'
        'env_key = "MODELGATE_KEY"\nwire_api = "responses"\n')
    env = {"CODEX_HOME": str(tmp_path), "MODELGATE_KEY": FULL_KEY}
    argv = [str(codex), "exec", "--skip-git-repo-check"] + (["-m", model] if model else []) + ["say hello"]
    answers(gateway, tmp_path, argv, env, "responses",
            lambda r: r["model"].startswith(model or "gpt-") and r["status"] == 200)


# aider's settings for a run with no terminal, no network and no repository: its model cost
# map from the installed litellm, no update check, analytics or release notes.
AIDER_QUIET = ["--no-git", "--yes-always", "--no-check-update", "--no-show-release-notes",
               "--no-analytics", "--no-show-model-warnings", "--no-pretty", "--no-fancy-input"]


@pytest.mark.parametrize("api,model,stream,endpoint,recorded", [
    # Its defaults: an OpenAI key makes it ask for gpt-4o, an Anthropic key for its "sonnet".
    ("openai", None, True, "chat", "gpt-4o"),
    ("anthropic", None, True, "messages", "claude-sonnet-"),
    # The other pool's model, translated both ways, streamed and plain. aider's Chat
    # requests carry `temperature`, which Anthropic's API lacks: `claude-sonnet-4-5` is on a
    # pool that drops it. (litellm sends an OpenAI model id it knows, say gpt-5.1, to OpenAI's
    # chat path whatever its `anthropic/` prefix says: an id it does not know stays Anthropic.)
    ("openai", "openai/claude-sonnet-4-5", True, "chat", "claude-sonnet-4-5"),
    ("openai", "openai/claude-sonnet-4-5", False, "chat", "claude-sonnet-4-5"),
    ("anthropic", "anthropic/gpt-5.5", True, "messages", "gpt-5.5"),
    ("anthropic", "anthropic/gpt-5.5", False, "messages", "gpt-5.5"),
])
def test_aider_answers_through_the_gateway(gateway, tmp_path, api, model, stream, endpoint,
                                           recorded):
    if not AIDER.exists():
        pytest.fail(".venv-aider is not installed: run scripts/install-deps.sh --test")
    base = gateway.base_url("main")
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    if api == "openai":
        env |= {"OPENAI_API_KEY": FULL_KEY, "OPENAI_API_BASE": base}
    else:
        env |= {"ANTHROPIC_API_KEY": FULL_KEY, "ANTHROPIC_API_BASE": base.removesuffix("/v1")}
    argv = [str(AIDER), "--message", "say hello", *AIDER_QUIET]
    argv += (["--model", model] if model else []) + ([] if stream else ["--no-stream"])
    answers(gateway, tmp_path, argv, env, endpoint,
            lambda r: (r["model"].startswith(recorded) and r["stream"] == stream
                       and r["status"] == 200 and r["completion_tokens"] > 0))
