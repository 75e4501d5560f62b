"""The coding agents, unchanged, through the gateway's translated pools: Claude Code (the
Messages API, with its own tools and context management) and Codex (the Responses API, with
its function, namespace and hosted tools), each once with its default model (mapped by the
config's globs: `claude-*` to the Anthropic-speaking pool, `gpt-*` to the chat-only pool) and
once with the other pool's model. Both from npm, installed in tests/node."""

import os
import subprocess
import time

import pytest

from harness import FULL_KEY, MOCK_REPLY, REPO_ROOT

BIN = REPO_ROOT / "tests/node/node_modules/.bin"
NODE_PATH = f"{BIN}:{os.environ.get('PATH', '')}"


def run(argv, env, home):
    env = {"PATH": NODE_PATH, "HOME": str(home), **env}
    done = subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr


def records_since(gateway, start_ms, endpoint):
    import json
    import urllib.request
    url = gateway.base_url("direct").removesuffix("/v1") + "/api/usage?limit=1000&order=desc"
    deadline = time.monotonic() + 10
    while True:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {FULL_KEY}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            recs = [x for x in json.loads(r.read())["data"] if x["endpoint"] == endpoint]
        # Records are written in batches: wait for this run's.
        if recs or time.monotonic() > deadline:
            return recs
        time.sleep(0.1)


@pytest.mark.parametrize("model", [None, "gpt-5.1"])
def test_claude_code_answers_through_the_gateway(gateway, tmp_path, model):
    claude = BIN / "claude"
    if not claude.exists():
        pytest.fail("tests/node is not installed: run scripts/install-deps.sh --test")
    env = {"ANTHROPIC_BASE_URL": gateway.base_url("main").removesuffix("/v1"),
           "ANTHROPIC_API_KEY": FULL_KEY, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1"}
    argv = [str(claude), "-p", "say hello"] + (["--model", model] if model else [])
    code, out = run(argv, env, tmp_path)
    assert code == 0 and MOCK_REPLY in out, out[-2000:]
    recs = records_since(gateway, 0, "messages")
    wanted = model or "claude-"
    assert any(r["model"].startswith(wanted) and r["status"] == 200 for r in recs), recs[:5]


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
    code, out = run(argv, env, tmp_path)
    assert code == 0 and MOCK_REPLY in out, out[-2000:]
    recs = records_since(gateway, 0, "responses")
    wanted = model or "gpt-"
    assert any(r["model"].startswith(wanted) and r["status"] == 200 for r in recs), recs[:5]
