"""The official Node clients against the gateway's translated pools: OpenAI's Node SDK (Chat
Completions with its stream helper and tools, the Responses API's stream helper) and the Vercel
AI SDK (generateText / streamText with tools through @ai-sdk/openai's chat and responses models
and @ai-sdk/anthropic). They run unchanged in tests/node/clients.mjs (Node 22 from npm,
installed by scripts/install-deps.sh --test); this checks what each one parsed."""

import json
import subprocess

import pytest

from harness import FULL_KEY, MOCK_REPLY, REPO_ROOT

NODE_DIR = REPO_ROOT / "tests/node"
NODE = NODE_DIR / "node_modules/.bin/node"


@pytest.fixture(scope="module")
def outcomes(gateway):
    if not NODE.exists():
        pytest.fail("tests/node is not installed: run scripts/install-deps.sh --test")
    done = subprocess.run([str(NODE), "clients.mjs", gateway.base_url("main"), FULL_KEY],
                          cwd=NODE_DIR, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("case", [
    "openai_chat_plain", "openai_responses_stream", "ai_openai_chat_generate",
    "ai_openai_responses_stream", "ai_anthropic_generate",
])
def test_a_node_client_reads_a_translated_reply(outcomes, case):
    got = outcomes[case]
    assert got["ok"], got.get("error")
    assert got["text"] == MOCK_REPLY, got


@pytest.mark.parametrize("case", ["ai_openai_chat_stream_tools", "ai_anthropic_stream_tools"])
def test_the_vercel_ai_sdk_reads_a_translated_streamed_tool_call(outcomes, case):
    got = outcomes[case]
    assert got["ok"], got.get("error")
    assert (got["finish"], got["calls"]) == ("tool-calls", [["get_weather", {"city": "echo"}]])


def test_the_openai_node_stream_helper_accumulates_a_translated_tool_call(outcomes):
    got = outcomes["openai_chat_stream_tools"]
    assert got["ok"], got.get("error")
    assert (got["finish"], got["name"], got["args"]) == ("tool_calls", "get_weather", {"city": "echo"})


def test_node_clients_read_the_usage(outcomes):
    assert outcomes["openai_chat_plain"]["usage"]["completion_tokens"] == 8
    assert outcomes["openai_responses_stream"]["usage"]["output_tokens"] == 8
    assert outcomes["ai_anthropic_generate"]["usage"]["outputTokens"] == 8
