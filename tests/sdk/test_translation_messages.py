"""Anthropic's Messages API translated to Chat Completions: the official anthropic SDK, with
strict response validation, against a model whose pool passes only Chat Completions through
(`native = ["chat"]`, the mock's `/v1/chat/completions`). Every reply and stream must parse
unchanged (the SDK's stream helper accumulates them); the request that reached the provider
must be a valid chat request by the openai SDK's own parameter types; the usage record must
carry the provider's exact counts.

Test vectors: requests written from Anthropic's Messages reference (system, content blocks,
tools, tool_choice, thinking); the provider side is the mock's Chat Completions (see
src/mock_upstream/chat_turn.rs), written from OpenAI's Chat Completions reference.
"""

import base64
import json

import anthropic
import pytest
from openai.types.chat import completion_create_params

import typecheck
from harness import FULL_KEY, MOCK_REPLY, MOCK_REPLY_TOKENS
from test_responses_messages_sdk import record_of

MODEL = "gpt-5.1"
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
ECHO = {"x-mock-echo-body": "1"}
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
       "RU5ErkJggg==")


@pytest.fixture
def claude(base_url):
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=FULL_KEY,
                                 max_retries=0, timeout=30, _strict_response_validation=True)
    yield client
    client.close()


def sent_upstream(raw) -> dict:
    """The chat request the provider got, checked against the openai SDK's parameter types."""
    body = json.loads(base64.b64decode(raw.headers["x-mock-body"]))
    params = (completion_create_params.CompletionCreateParamsStreaming if body.get("stream")
              else completion_create_params.CompletionCreateParamsNonStreaming)
    typecheck.check(body, params)
    return body


def test_a_message_reaches_a_chat_pool_as_a_chat_completion(claude, gateway):
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=100, system="be brief", stop_sequences=["END"],
        metadata={"user_id": "user-7"},
        messages=[{"role": "user", "content": "say hello to me"}], extra_headers=ECHO)
    assert raw.headers["x-mock-path"] == "/v1/chat/completions"
    assert raw.headers["x-mock-authorization"] == "Bearer sk-openai-mock-credential"
    sent = sent_upstream(raw)
    assert sent["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "say hello to me"}]
    assert (sent["max_completion_tokens"], sent["stop"], sent["user"]) == (100, ["END"], "user-7")
    m = raw.parse()
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == MOCK_REPLY
    assert m.stop_reason == "end_turn"
    assert (m.usage.input_tokens, m.usage.output_tokens) == (6, MOCK_REPLY_TOKENS)
    rec = record_of(gateway, raw.headers["x-request-id"])
    assert (rec["model"], rec["endpoint"], rec["status"], rec["estimated"]) == (MODEL, "messages", 200, False)
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (6, MOCK_REPLY_TOKENS)


def test_a_translated_stream_parses_with_the_sdk_stream_helper(claude, gateway):
    with claude.messages.stream(model=MODEL, max_tokens=100,
                                messages=[{"role": "user", "content": "say hello to me"}]) as s:
        kinds = [e.type for e in s]
        m = s.get_final_message()
        request_id = s.response.headers["x-request-id"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert m.content[0].text == MOCK_REPLY and m.stop_reason == "end_turn"
    assert (m.usage.input_tokens, m.usage.output_tokens) == (4, MOCK_REPLY_TOKENS)
    rec = record_of(gateway, request_id)
    assert (rec["stream"], rec["completion_tokens"], rec["estimated"]) == (True, MOCK_REPLY_TOKENS, False)


def test_tool_use_and_its_result_go_both_ways(claude):
    messages = [{"role": "user", "content": "weather in Paris?"}]
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=200, tools=[WEATHER], messages=messages,
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_headers=ECHO)
    sent = sent_upstream(raw)
    assert sent["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": WEATHER["input_schema"]}}]
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("required", False)
    m = raw.parse()
    assert m.stop_reason == "tool_use"
    call = next(b for b in m.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.input == {"city": "echo"}

    messages.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"},
        {"type": "text", "text": "and tomorrow?"}]})
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=200, tools=[WEATHER], messages=messages, extra_headers=ECHO)
    sent = sent_upstream(raw)
    roles = [x["role"] for x in sent["messages"]]
    assert roles == ["user", "assistant", "tool", "user"]
    assert sent["messages"][1]["tool_calls"][0]["id"] == call.id
    assert json.loads(sent["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"city": "echo"}
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}
    again = raw.parse()
    assert again.stop_reason == "end_turn" and again.content[0].text


def test_parallel_tool_calls_stream_as_separate_blocks(claude):
    with claude.messages.stream(model=MODEL, max_tokens=200, tools=[WEATHER],
                                messages=[{"role": "user", "content": "go"}],
                                extra_headers={"x-mock-tool-calls": "2"}) as s:
        m = s.get_final_message()
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) == 2 and len({c.id for c in calls}) == 2
    assert all(c.input == {"city": "echo"} for c in calls)
    assert m.stop_reason == "tool_use"


def test_thinking_asks_for_reasoning_and_comes_back_as_a_thinking_block(claude, gateway):
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=3000, thinking={"type": "enabled", "budget_tokens": 2048},
        messages=[{"role": "user", "content": "hi"}], extra_headers=ECHO)
    assert sent_upstream(raw)["reasoning_effort"] == "low"
    rec = record_of(gateway, raw.headers["x-request-id"])
    # The mock's 10 words of reasoning are output tokens, priced as reasoning (20.0 per 1M).
    assert (rec["completion_tokens"], rec["reasoning_tokens"]) == (MOCK_REPLY_TOKENS + 10, 10)
    assert rec["cost"] == pytest.approx((1 * 1.25 + MOCK_REPLY_TOKENS * 10.0 + 10 * 20.0) / 1e6, abs=1e-12)
    m = raw.parse()
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking
    with claude.messages.stream(model=MODEL, max_tokens=3000,
                                thinking={"type": "enabled", "budget_tokens": 2048},
                                messages=[{"role": "user", "content": "hi"}]) as s:
        streamed = s.get_final_message()
    assert streamed.content[0].type == "thinking"
    assert streamed.content[0].thinking == m.content[0].thinking


def test_images_and_documents_become_content_parts(claude):
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=50, extra_headers=ECHO,
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
            {"type": "text", "text": "what are these"}]}])
    parts = sent_upstream(raw)["messages"][0]["content"]
    assert parts[0] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assert parts[1] == {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert parts[2] == {"type": "text", "text": "what are these"}


@pytest.mark.parametrize("params, named", [
    ({"extra_body": {"top_k": 5}}, "top_k"),
])
def test_what_chat_completions_lack_is_a_400_naming_it(claude, params, named):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=50,
                               messages=[{"role": "user", "content": "hi"}], **params)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert named in e.value.body["error"]["message"]


@pytest.mark.parametrize("status, error, kind", [
    (429, anthropic.RateLimitError, "rate_limit_error"),
    (400, anthropic.BadRequestError, "invalid_request_error"),
    (500, anthropic.InternalServerError, "api_error"),
])
def test_provider_errors_reach_the_client_in_anthropic_shape(claude, status, error, kind):
    with pytest.raises(error) as e:
        claude.messages.create(model=MODEL, max_tokens=50,
                               messages=[{"role": "user", "content": "hi"}],
                               extra_headers={"x-mock-status": str(status), "x-mock-retry-after": "0"})
    assert e.value.status_code == status
    assert e.value.body["error"]["type"] == kind
    # The provider's Retry-After reaches the client, whichever API it speaks.
    assert e.value.response.headers.get("retry-after") == "0"
    assert "mock upstream forced status" in e.value.body["error"]["message"]


def test_a_server_tool_is_left_out_and_named_in_a_header(claude):
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "web_search_20250305", "name": "web_search"}, WEATHER])
    assert raw.headers["x-modelgate-tools-dropped"] == "web_search_20250305"
    assert raw.parse().stop_reason == "tool_use"
