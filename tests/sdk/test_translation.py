"""Chat Completions translated to Anthropic's Messages API: the official OpenAI SDK, with
strict response validation, against a model whose pool speaks Anthropic's API (the mock's
`/v1/messages`). Every reply and stream must parse unchanged; the request that reached the
provider must be a valid message request by the anthropic SDK's own parameter types; the
usage record must carry the provider's exact counts.

Test vectors: requests written from OpenAI's Chat Completions reference (messages, tools,
tool_choice, images, stream_options); the provider side is the mock's Messages API, written
from Anthropic's Messages and streaming references (see src/mock_upstream/anthropic.rs).
"""

import base64
import json
import anthropic
import openai
import pytest
from anthropic.types import message_create_params

import typecheck
from harness import FULL_KEY, MOCK_REPLY, MOCK_REPLY_TOKENS
from test_responses_messages_sdk import record_of

MODEL = "claude-sonnet-5-5"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
# A 1x1 PNG.
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
       "RU5ErkJggg==")


@pytest.fixture
def strict(base_url):
    """An OpenAI client that validates every reply against the SDK's types."""
    client = openai.OpenAI(base_url=base_url, api_key=FULL_KEY, max_retries=0, timeout=30,
                           _strict_response_validation=True)
    yield client
    client.close()


def sent_upstream(raw) -> dict:
    """The request the provider got (the mock echoes it with `x-mock-echo-body`), checked
    against the anthropic SDK's parameter types: no field it does not know, every block valid."""
    body = json.loads(base64.b64decode(raw.headers["x-mock-body"]))
    params = (message_create_params.MessageCreateParamsStreaming if body.get("stream")
              else message_create_params.MessageCreateParamsNonStreaming)
    typecheck.check(body, params)
    return body


ECHO = {"x-mock-echo-body": "1"}


def test_a_chat_request_reaches_an_anthropic_pool_as_a_message(strict, gateway):
    raw = strict.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=100, stop=["END"], user="user-7",
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "say hello to me"}],
        extra_headers=ECHO)
    sent = sent_upstream(raw)
    assert raw.headers["x-mock-path"] == "/v1/messages"
    assert raw.headers["x-mock-x-api-key"] == "sk-ant-mock-credential"
    assert raw.headers["x-mock-anthropic-version"] == "2026-10-21"
    assert raw.headers["x-mock-authorization"] == ""
    assert sent["system"] == [{"type": "text", "text": "be brief"}]
    assert sent["messages"] == [{"role": "user",
                                 "content": [{"type": "text", "text": "say hello to me"}]}]
    assert (sent["max_tokens"], sent["stop_sequences"]) == (100, ["END"])
    assert sent["metadata"] == {"user_id": "user-7"}

    c = raw.parse()
    assert c.object == "chat.completion"
    assert c.model == MODEL
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == MOCK_REPLY
    assert c.choices[0].finish_reason == "stop"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (6, MOCK_REPLY_TOKENS)
    assert c.usage.total_tokens == 6 + MOCK_REPLY_TOKENS
    rec = record_of(gateway, raw.headers["x-request-id"])
    assert (rec["model"], rec["status"], rec["estimated"]) == (MODEL, 200, False)
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (6, MOCK_REPLY_TOKENS)


def test_a_translated_stream_parses_with_usage_and_done(strict, gateway):
    raw = strict.chat.completions.with_raw_response.create(
        model=MODEL, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "say hello to me"}])
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == MOCK_REPLY
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MOCK_REPLY_TOKENS
    rec = record_of(gateway, raw.headers["x-request-id"])
    assert (rec["stream"], rec["completion_tokens"], rec["estimated"]) == (True, MOCK_REPLY_TOKENS, False)


def test_a_stream_without_include_usage_has_no_usage_chunk(strict):
    chunks = list(strict.chat.completions.create(
        model=MODEL, stream=True, messages=[{"role": "user", "content": "hi"}]))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_tool_calls_and_their_results_go_both_ways(strict):
    messages = [{"role": "user", "content": "weather in Paris?"}]
    raw = strict.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, extra_headers=ECHO)
    sent = sent_upstream(raw)
    assert sent["tools"][0]["name"] == "get_weather"
    assert sent["tools"][0]["input_schema"] == WEATHER["function"]["parameters"]
    assert sent["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    c = raw.parse()
    choice = c.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "echo"}

    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    raw = strict.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=[WEATHER], extra_headers=ECHO)
    sent = sent_upstream(raw)
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][1]["content"][-1] == {
        "type": "tool_use", "id": call.id, "name": "get_weather", "input": {"city": "echo"}}
    assert sent["messages"][2]["content"] == [{
        "type": "tool_result", "tool_use_id": call.id,
        "content": [{"type": "text", "text": "sunny, 21 C"}]}]
    answer = raw.parse().choices[0]
    assert answer.finish_reason == "stop" and answer.message.content


def test_parallel_tool_calls_stream_with_their_own_indexes_and_ids(strict):
    stream = strict.chat.completions.create(
        model=MODEL, stream=True, tools=[WEATHER], messages=[{"role": "user", "content": "go"}],
        extra_headers={"x-mock-tool-calls": "2"})
    calls: dict = {}
    finish = None
    for chunk in stream:
        for d in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                assert call["id"] is None, "an id comes once, with the call's first piece"
                call["id"] = d.id
            if d.function and d.function.name:
                call["name"] += d.function.name
            if d.function and d.function.arguments:
                call["arguments"] += d.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert len({c["id"] for c in calls.values()}) == 2
    for c in calls.values():
        assert c["name"] == "get_weather" and json.loads(c["arguments"]) == {"city": "echo"}


def test_the_sdk_stream_helper_accumulates_a_translated_tool_call(strict):
    with strict.chat.completions.stream(
            model=MODEL, tools=[WEATHER], messages=[{"role": "user", "content": "go"}]) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "echo"}
    assert final.choices[0].finish_reason == "tool_calls"


def test_images_by_url_and_inline_become_image_blocks(strict):
    raw = strict.chat.completions.with_raw_response.create(
        model=MODEL, extra_headers=ECHO,
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]}])
    blocks = sent_upstream(raw)["messages"][0]["content"]
    assert blocks[1] == {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    assert blocks[2] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": PNG}}
    assert raw.parse().choices[0].message.content == MOCK_REPLY


def reasoning_of(message) -> tuple:
    extra = message.model_extra or {}
    return extra.get("reasoning_content"), extra.get("thinking_blocks")


def test_reasoning_comes_back_and_its_signature_goes_back_on_the_next_turn(strict):
    messages = [{"role": "user", "content": "weather?"}]
    raw = strict.chat.completions.with_raw_response.create(
        model=MODEL, reasoning_effort="low", max_completion_tokens=2000, tools=[WEATHER],
        messages=messages, extra_headers=ECHO)
    sent = sent_upstream(raw)
    assert sent["thinking"] == {"type": "adaptive"}
    assert sent["output_config"] == {"effort": "low"}
    message = raw.parse().choices[0].message
    text, blocks = reasoning_of(message)
    assert text and blocks and blocks[0]["signature"]
    assert message.tool_calls
    # The assistant turn as the client got it goes back: the mock refuses a thinking block
    # whose signature is not its own, and a tool turn that lost its thinking.
    messages.append(message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "ok"})
    again = strict.chat.completions.create(
        model=MODEL, reasoning_effort="low", max_completion_tokens=2000, tools=[WEATHER],
        messages=messages)
    assert again.choices[0].finish_reason == "stop"


def test_streamed_reasoning_carries_its_signature(strict):
    chunks = list(strict.chat.completions.create(
        model=MODEL, stream=True, reasoning_effort="low", max_completion_tokens=2000,
        messages=[{"role": "user", "content": "hi"}]))
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                        for c in chunks if c.choices)
    blocks = [b for c in chunks if c.choices
              for b in (c.choices[0].delta.model_extra or {}).get("thinking_blocks") or []]
    assert reasoning and len(blocks) == 1
    assert blocks[0]["thinking"] == reasoning and blocks[0]["signature"]


def test_cached_prompt_tokens_are_reported_and_recorded(strict, gateway):
    raw = strict.chat.completions.with_raw_response.create(
        model=MODEL, extra_headers=ECHO,
        messages=[{"role": "system", "content": [
                      {"type": "text", "text": "a long stable system prompt of ten words here",
                       "cache_control": {"type": "ephemeral"}}]},
                  {"role": "user", "content": "say hello to me"}])
    assert sent_upstream(raw)["system"][0]["cache_control"] == {"type": "ephemeral"}
    c = raw.parse()
    assert c.usage.prompt_tokens_details.cached_tokens == 9
    assert c.usage.prompt_tokens == 9 + 4
    rec = record_of(gateway, raw.headers["x-request-id"])
    assert (rec["prompt_tokens"], rec["cached_prompt_tokens"], rec["cache_write_tokens"]) == (13, 9, 0)
    # Each token once at its price: 4 prompt at 3.0, 9 cached at 0.3, 8 output at 15.0 per 1M.
    assert rec["cost"] == pytest.approx((4 * 3.0 + 9 * 0.3 + 8 * 15.0) / 1e6, abs=1e-12)
    written = strict.chat.completions.with_raw_response.create(
        model=MODEL, extra_headers={"x-mock-cache-write": "1"},
        messages=[{"role": "system", "content": [
                      {"type": "text", "text": "a long stable system prompt of ten words here",
                       "cache_control": {"type": "ephemeral"}}]},
                  {"role": "user", "content": "say hello to me"}])
    assert written.parse().usage.prompt_tokens_details.cache_write_tokens == 9
    rec = record_of(gateway, written.headers["x-request-id"])
    assert (rec["cached_prompt_tokens"], rec["cache_write_tokens"]) == (0, 9)
    assert rec["cost"] == pytest.approx((4 * 3.0 + 9 * 3.75 + 8 * 15.0) / 1e6, abs=1e-12)


def test_a_json_schema_becomes_the_structured_output_format(strict):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"], "additionalProperties": False}
    raw = strict.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_headers=ECHO,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    assert sent_upstream(raw)["output_config"] == {"format": {"type": "json_schema", "schema": schema}}


def test_a_plain_reply_to_a_stream_request_still_reaches_the_client_as_a_stream(strict):
    chunks = list(strict.chat.completions.create(
        model=MODEL, stream=True, messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-mock-plain-reply": "1"}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == MOCK_REPLY
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("params, param", [
    ({"temperature": 0.2}, "temperature"),
    ({"top_p": 0.9}, "top_p"),
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"n": 2}, "n"),
    ({"seed": 7}, "seed"),
])
def test_a_parameter_the_provider_lacks_is_a_400_naming_it(strict, params, param):
    with pytest.raises(openai.BadRequestError) as e:
        strict.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], **params)
    assert e.value.body["param"] == param
    assert e.value.body["code"] == "unsupported_parameter"


def test_a_pools_drop_params_are_left_out_and_named_in_a_header(strict):
    # The harness's `claude-sonnet-4-5` is on a pool with drop_params = temperature, top_p.
    raw = strict.chat.completions.with_raw_response.create(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}],
        temperature=0, top_p=0.5, extra_headers=ECHO)
    assert raw.parse().choices[0].message.content == MOCK_REPLY
    assert raw.headers["x-modelgate-params-dropped"] == "temperature, top_p"
    sent = sent_upstream(raw)
    assert "temperature" not in sent and "top_p" not in sent
    # What the list does not name is still refused.
    with pytest.raises(openai.BadRequestError) as e:
        strict.chat.completions.create(
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}], seed=7)
    assert e.value.body["param"] == "seed"


@pytest.mark.parametrize("status, error, code", [
    (529, openai.InternalServerError, "overloaded"),
    (429, openai.RateLimitError, "rate_limit_exceeded"),
    (400, openai.BadRequestError, "invalid_request"),
])
def test_provider_errors_reach_the_client_in_openai_shape(strict, status, error, code):
    with pytest.raises(error) as e:
        strict.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-mock-status": str(status), "x-mock-retry-after": "0"})
    assert e.value.status_code == (503 if status == 529 else status)
    assert e.value.body["code"] == code
    # The provider's Retry-After reaches the client, whichever API it speaks.
    assert e.value.response.headers.get("retry-after") == "0"
    assert "mock upstream forced status" in e.value.body["message"]


def test_the_messages_api_still_passes_through_to_an_anthropic_pool(base_url):
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=FULL_KEY,
                                 max_retries=0, _strict_response_validation=True)
    m = client.messages.create(model=MODEL, max_tokens=50,
                               messages=[{"role": "user", "content": "say hello to me"}])
    assert m.content[0].text == MOCK_REPLY
    client.close()
