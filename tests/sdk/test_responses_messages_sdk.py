"""The official OpenAI SDK's Responses API and the official Anthropic SDK's Messages API,
unchanged (only `base_url` swapped), against the real gateway and its mock upstream, on both
listeners. Each call's usage record must carry the exact tokens the upstream reported.
"""

import json
import time
import urllib.request

import anthropic
import openai
import pytest

from harness import FULL_KEY, MOCK_REPLY, MOCK_REPLY_TOKENS, MODELS_ONLY_KEY, UNKNOWN_KEY

# "say hello to me" (4 words) + "be brief" (2): the mock counts words as tokens.
PROMPT_TOKENS = 6


def record_of(gateway, request_id: str) -> dict:
    """The usage record of a request (the store commits in batches: wait for it)."""
    deadline = time.monotonic() + 10
    url = gateway.base_url("direct").removesuffix("/v1") + "/api/usage?limit=1000&order=desc"
    while True:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {FULL_KEY}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            for rec in json.loads(r.read())["data"]:
                if rec["request_id"] == request_id:
                    return rec
        assert time.monotonic() < deadline, f"no record for {request_id}"
        time.sleep(0.05)


def assert_exact(rec: dict, endpoint: str, stream: bool):
    assert rec["endpoint"] == endpoint, rec
    assert rec["status"] == 200, rec
    assert rec["stream"] is stream, rec
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (PROMPT_TOKENS, MOCK_REPLY_TOKENS), rec
    assert rec["estimated"] is False, rec


# ---------------------------------------------------------------------------------------
# OpenAI Responses API
# ---------------------------------------------------------------------------------------


def test_responses_create_plain(client, gateway):
    raw = client.responses.with_raw_response.create(
        model="echo-1", input="say hello to me", instructions="be brief")
    response = raw.parse()
    assert response.output_text == MOCK_REPLY
    assert response.usage.input_tokens == PROMPT_TOKENS
    assert response.usage.output_tokens == MOCK_REPLY_TOKENS
    assert_exact(record_of(gateway, raw.headers["x-request-id"]), "responses", False)


def test_responses_create_streamed(client, gateway):
    raw = client.responses.with_raw_response.create(
        model="echo-1", input="say hello to me", instructions="be brief", stream=True)
    text, completed = "", None
    for event in raw.parse():
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.completed":
            completed = event.response
    assert text == MOCK_REPLY
    assert completed is not None and completed.usage.output_tokens == MOCK_REPLY_TOKENS
    assert_exact(record_of(gateway, raw.headers["x-request-id"]), "responses", True)


def test_responses_stream_helper_builds_the_final_response(client):
    with client.responses.stream(model="echo-1", input="say hello to me", instructions="be brief") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == MOCK_REPLY
    assert final.usage.total_tokens == PROMPT_TOKENS + MOCK_REPLY_TOKENS


def test_a_stored_response_is_retrieved_listed_and_deleted(client):
    made = client.responses.create(model="echo-1", input="say hello to me")
    again = client.responses.retrieve(made.id)
    assert again.id == made.id and again.output_text == MOCK_REPLY
    items = list(client.responses.input_items.list(made.id))
    assert items and items[0].content[0].text == "say hello to me"
    client.responses.delete(made.id)
    # A gateway with one upstream asks it even for an id it does not know: the upstream's 404.
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)


def test_responses_need_the_responses_group(client_for):
    with pytest.raises(openai.PermissionDeniedError):
        client_for(MODELS_ONLY_KEY).responses.create(model="echo-1", input="hi")


# ---------------------------------------------------------------------------------------
# Anthropic Messages API
# ---------------------------------------------------------------------------------------


@pytest.fixture
def claude(base_url):
    """An Anthropic SDK client whose base_url is the gateway (the SDK adds /v1/messages)."""
    made = []

    def make(key: str = FULL_KEY) -> anthropic.Anthropic:
        c = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=30)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


MESSAGES = [{"role": "user", "content": "say hello to me"}]


def test_messages_create_plain(claude, gateway):
    raw = claude().messages.with_raw_response.create(
        model="echo-1", max_tokens=64, system="be brief", messages=MESSAGES)
    message = raw.parse()
    assert message.content[0].text == MOCK_REPLY
    assert (message.usage.input_tokens, message.usage.output_tokens) == (PROMPT_TOKENS, MOCK_REPLY_TOKENS)
    assert raw.headers["x-mock-anthropic-version"], "anthropic-version reaches the upstream"
    assert raw.headers["x-mock-x-api-key"] == "", "the client's key never does"
    assert_exact(record_of(gateway, raw.headers["x-request-id"]), "messages", False)


def test_messages_create_streamed(claude, gateway):
    raw = claude().messages.with_raw_response.create(
        model="echo-1", max_tokens=64, system="be brief", messages=MESSAGES, stream=True)
    text = ""
    for event in raw.parse():
        if event.type == "content_block_delta":
            text += event.delta.text
    assert text == MOCK_REPLY
    assert_exact(record_of(gateway, raw.headers["x-request-id"]), "messages", True)


def test_messages_stream_helper_and_token_counting(claude):
    with claude().messages.stream(model="echo-1", max_tokens=64, system="be brief", messages=MESSAGES) as stream:
        assert "".join(stream.text_stream) == MOCK_REPLY
        final = stream.get_final_message()
    assert final.usage.output_tokens == MOCK_REPLY_TOKENS
    counted = claude().messages.count_tokens(model="echo-1", system="be brief", messages=MESSAGES)
    assert counted.input_tokens == PROMPT_TOKENS


def test_anthropic_sdk_lists_and_retrieves_models(claude):
    """The model list in Anthropic's shape for its SDK, filtered by the key as for OpenAI's."""
    ids = [m.id for m in claude().models.list()]
    assert "echo-1" in ids
    model = claude().models.retrieve("echo-1")
    assert (model.id, model.type, model.display_name) == ("echo-1", "model", "echo-1")
    assert model.created_at.year >= 2024
    with pytest.raises(anthropic.NotFoundError):
        claude().models.retrieve("no-such-model")
    with pytest.raises(anthropic.AuthenticationError):
        claude(UNKNOWN_KEY).models.list()


def test_anthropic_sdk_errors_have_their_classes(claude):
    with pytest.raises(anthropic.AuthenticationError) as e:
        claude(UNKNOWN_KEY).messages.create(model="echo-1", max_tokens=8, messages=MESSAGES)
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        claude().messages.create(model="no-such-model", max_tokens=8, messages=MESSAGES)
    with pytest.raises(anthropic.PermissionDeniedError):
        claude(MODELS_ONLY_KEY).messages.create(model="echo-1", max_tokens=8, messages=MESSAGES)
