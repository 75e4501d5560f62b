"""The official OpenAI Python SDK, unchanged, against the real modelgate binary.

One gateway is started for the whole session from a temp config: its listeners and its
in-process mock upstream on free loopback ports, the demo models, and a keys file with a
full key, a key limited to `echo-*`, a models-only key and a disabled key. Every API test
runs against both the `main` and the `direct` listener.

Run: `cargo build && MODELGATE_BIN=target/debug/modelgate .venv/bin/python -m pytest -q tests/sdk`
"""

import base64
import json
import time
import urllib.error
import urllib.request

import openai
import pytest

from harness import *  # noqa: F401,F403  (keys, models, the mock's reply)


def assert_gateway_error(exc: openai.APIStatusError, status: int, code: str, param=None):
    assert exc.status_code == status, exc.body
    assert isinstance(exc.body, dict), exc.body
    assert exc.code == code, exc.body
    assert exc.body.get("code") == code
    assert exc.body.get("message")
    assert exc.body.get("type")
    assert exc.param == param, exc.body
    assert exc.response.headers.get("content-type", "").startswith("application/json")
    assert exc.response.headers.get("x-request-id")


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------


def test_models_list_returns_every_configured_model(client):
    models = list(client.models.list())
    assert [m.id for m in models] == LISTED
    assert all(m.object == "model" for m in models)


def test_a_model_can_be_retrieved_by_id(client):
    model = client.models.retrieve("demo-large")
    assert model.id == "demo-large"
    assert model.object == "model"


def test_a_key_limited_to_echo_models_lists_only_echo_1(client_for):
    models = list(client_for(ECHO_ONLY_KEY).models.list())
    assert [m.id for m in models] == ["echo-1"]


def test_a_models_only_key_may_list_models(client_for):
    assert [m.id for m in client_for(MODELS_ONLY_KEY).models.list()] == LISTED


# ---------------------------------------------------------------------------------------
# Chat and completions
# ---------------------------------------------------------------------------------------

PROMPT = [{"role": "user", "content": "Say hello to the gateway"}]  # 5 words


def test_chat_completion_returns_the_mock_reply_and_usage(client):
    completion = client.chat.completions.create(model="echo-1", messages=PROMPT)
    choice = completion.choices[0]
    assert choice.message.content == MOCK_REPLY
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 5
    assert completion.usage.completion_tokens == MOCK_REPLY_TOKENS
    assert completion.usage.total_tokens == 5 + MOCK_REPLY_TOKENS


def test_an_aliased_model_is_sent_upstream_renamed_and_without_the_client_key(client):
    raw = client.chat.completions.with_raw_response.create(model="demo-large", messages=PROMPT)
    assert raw.headers["x-mock-model"] == "echo-1"
    assert raw.headers["x-mock-path"] == "/v1/chat/completions"
    assert FULL_KEY not in raw.headers.get("x-mock-authorization", "")
    assert raw.headers.get("x-request-id")
    assert raw.parse().choices[0].message.content == MOCK_REPLY


def test_streamed_chat_deltas_add_up_to_the_mock_reply_and_end_with_stop(client):
    chunks = list(client.chat.completions.create(model="echo-1", messages=PROMPT, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == MOCK_REPLY
    assert chunks, "no chunks streamed"
    last = chunks[-1]
    assert last.choices and last.choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks), "usage chunk sent without include_usage"


def test_streamed_chat_with_include_usage_ends_with_a_usage_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model="demo-large",
            messages=PROMPT,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == MOCK_REPLY
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.prompt_tokens == 5
    assert usage_chunk.usage.completion_tokens == MOCK_REPLY_TOKENS
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]


def test_legacy_completion_returns_the_mock_reply(client):
    completion = client.completions.create(model="echo-1", prompt="Say hello")
    assert completion.choices[0].text == MOCK_REPLY
    assert completion.usage.completion_tokens == MOCK_REPLY_TOKENS


# ---------------------------------------------------------------------------------------
# Embeddings and moderations
# ---------------------------------------------------------------------------------------


def test_embeddings_in_the_sdks_default_base64_encoding_decode_to_8_floats(client):
    result = client.embeddings.create(model="text-embedding-demo", input=["one", "two words"])
    assert [d.index for d in result.data] == [0, 1]
    for item in result.data:
        assert len(item.embedding) == 8
        assert all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in item.embedding)
    assert result.data[0].embedding != result.data[1].embedding
    assert result.usage.prompt_tokens == 3


def test_embeddings_as_floats_equal_the_base64_ones(client):
    as_base64 = client.embeddings.create(model="text-embedding-demo", input="same text")
    as_float = client.embeddings.create(
        model="text-embedding-demo", input="same text", encoding_format="float"
    )
    assert as_float.data[0].embedding == pytest.approx(as_base64.data[0].embedding)


def test_moderation_returns_one_result_per_input(client):
    result = client.moderations.create(model="moderation-demo", input=["fine", "also fine"])
    assert len(result.results) == 2
    assert all(r.flagged is False for r in result.results)


# ---------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def assert_mock_images(response, n: int):
    assert len(response.data) == n
    for image in response.data:
        assert base64.b64decode(image.b64_json).startswith(b"\x89PNG")


def test_image_generation_returns_n_images(client):
    response = client.images.generate(model="image-demo", prompt="a lighthouse", n=2)
    assert_mock_images(response, 2)
    assert response.data[0].revised_prompt == "a lighthouse"


def test_image_edit_uploads_the_image_as_multipart(client):
    raw = client.images.with_raw_response.edit(
        model="image-demo", image=("in.png", PNG, "image/png"), prompt="add a boat"
    )
    assert raw.headers["x-mock-model"] == "image-demo"
    assert raw.headers["x-mock-path"] == "/v1/images/edits"
    assert int(raw.headers["x-mock-body-len"]) > len(PNG)
    assert_mock_images(raw.parse(), 1)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks it deprecated
def test_image_variation_uploads_the_image_as_multipart(client):
    response = client.images.create_variation(
        model="image-demo", image=("in.png", PNG, "image/png"), n=3
    )
    assert_mock_images(response, 3)


# ---------------------------------------------------------------------------------------
# Audio
# ---------------------------------------------------------------------------------------

WAV = b"RIFF" + bytes(1000) + b"WAVE"  # 1008 bytes


def test_transcription_of_an_uploaded_file_mentions_its_byte_count(client):
    result = client.audio.transcriptions.create(
        file=("a.wav", WAV, "audio/wav"), model="whisper-demo"
    )
    assert f"{len(WAV)} bytes" in result.text


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks it deprecated
def test_translation_of_an_uploaded_file_mentions_its_byte_count(client):
    result = client.audio.translations.create(
        file=("a.wav", WAV, "audio/wav"), model="whisper-demo"
    )
    assert f"{len(WAV)} bytes" in result.text


def test_speech_returns_binary_audio(client):
    speech = client.audio.speech.create(model="tts-demo", voice="alloy", input="Hello there")
    audio = speech.read()
    assert audio.startswith(b"ID3")
    assert len(audio) == 4096
    assert speech.response.headers["content-type"].startswith("audio/mpeg")


# ---------------------------------------------------------------------------------------
# Errors made by the gateway
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [UNKNOWN_KEY, DISABLED_KEY], ids=["unknown", "disabled"])
def test_an_unknown_or_disabled_key_is_an_authentication_error(client_for, key):
    with pytest.raises(openai.AuthenticationError) as caught:
        client_for(key).chat.completions.create(model="echo-1", messages=PROMPT)
    assert_gateway_error(caught.value, 401, "invalid_api_key")


def test_an_unknown_key_cannot_list_models(client_for):
    with pytest.raises(openai.AuthenticationError) as caught:
        client_for(UNKNOWN_KEY).models.list()
    assert_gateway_error(caught.value, 401, "invalid_api_key")


def test_an_unknown_model_is_not_found_with_code_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=PROMPT)
    assert_gateway_error(caught.value, 404, "model_not_found", param="model")
    assert caught.value.body["type"] == "invalid_request_error"


def test_a_key_limited_to_echo_models_may_not_use_demo_large(client_for):
    client = client_for(ECHO_ONLY_KEY)
    assert client.chat.completions.create(model="echo-1", messages=PROMPT).choices
    with pytest.raises(openai.PermissionDeniedError) as caught:
        client.chat.completions.create(model="demo-large", messages=PROMPT)
    assert_gateway_error(caught.value, 403, "permission_denied", param="model")


def test_a_models_only_key_may_not_call_chat(client_for):
    with pytest.raises(openai.PermissionDeniedError) as caught:
        client_for(MODELS_ONLY_KEY).chat.completions.create(model="echo-1", messages=PROMPT)
    assert_gateway_error(caught.value, 403, "permission_denied", param="endpoint")


def test_a_key_over_its_rpm_gets_a_rate_limit_error_with_retry_after(client_for):
    # rpm = 2, shared by both listeners: within at most 3 calls the SDK must raise.
    client = client_for(RATE_KEY)
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(3):
            client.chat.completions.create(model="echo-1", messages=PROMPT)
    assert_gateway_error(caught.value, 429, "rate_limit_exceeded")
    headers = caught.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"


def test_an_upstream_401_becomes_a_502_upstream_error(client):
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(
            model="echo-1", messages=PROMPT, extra_headers={"x-mock-status": "401"}
        )
    assert_gateway_error(caught.value, 502, "upstream_error")


def test_the_gateway_error_body_is_openai_shaped_json(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=PROMPT)
    body = json.loads(caught.value.response.text)
    assert set(body) == {"error"}
    assert set(body["error"]) >= {"message", "type", "param", "code"}


def test_billing_endpoints_answer_through_the_sdks_raw_client(client_for):
    """Chat front-ends read the balance with the SDK's generic GET; it must parse unchanged."""
    client = client_for(PAGE_KEY)
    sub = client.get("/dashboard/billing/subscription", cast_to=object)
    assert sub["object"] == "billing_subscription"
    assert sub["hard_limit_usd"] == 50.0
    usage = client.get("/dashboard/billing/usage", cast_to=object,
                       options={"params": {"start_date": "2026-01-01", "end_date": "2026-02-01"}})
    assert usage["object"] == "list" and usage["total_usage"] == 0
    assert len(usage["daily_costs"]) == 31
    with pytest.raises(openai.BadRequestError) as e:
        client.get("/dashboard/billing/usage", cast_to=object,
                   options={"params": {"start_date": "2026-01-01", "end_date": "2026-12-31"}})
    assert_gateway_error(e.value, 400, "invalid_parameter", "start_date")
