"""The Responses API translated for pools that do not speak it: the official OpenAI SDK,
with strict response validation, against a model served by Anthropic's API (`claude-*`) and
one whose pool passes only Chat Completions (`gpt-*`). Replies and streams must parse
unchanged (the SDK's stream helper accumulates them), the request that reached the provider
must be valid by that provider's SDK types, and the record must carry the provider's counts.

Test vectors: requests written from OpenAI's Responses reference (input items, function
tools, reasoning, text.format); the providers are the mock's Messages API and Chat
Completions.
"""

import json

import openai
import pytest

import test_translation
import test_translation_messages
from harness import MOCK_REPLY, MOCK_REPLY_TOKENS
from test_translation import strict  # noqa: F401 (a fixture)
from test_responses_messages_sdk import record_of

MODELS = {"claude-sonnet-5-5": test_translation.sent_upstream,
          "gpt-5.1": test_translation_messages.sent_upstream}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
ECHO = {"x-mock-echo-body": "1"}


@pytest.fixture(params=list(MODELS))
def model(request):
    return request.param


def test_a_response_is_made_by_a_pool_of_another_api(strict, gateway, model):
    raw = strict.responses.with_raw_response.create(
        model=model, input="say hello to me", instructions="be brief", store=False,
        max_output_tokens=100, extra_headers=ECHO)
    sent = MODELS[model](raw)
    assert "be brief" in json.dumps(sent)
    r = raw.parse()
    assert r.object == "response" and r.status == "completed" and r.model == model
    assert r.output_text == MOCK_REPLY
    assert (r.usage.input_tokens, r.usage.output_tokens) == (6, MOCK_REPLY_TOKENS)
    assert r.usage.total_tokens == 6 + MOCK_REPLY_TOKENS
    rec = record_of(gateway, raw.headers["x-request-id"])
    assert (rec["endpoint"], rec["model"], rec["estimated"]) == ("responses", model, False)
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (6, MOCK_REPLY_TOKENS)


def test_a_translated_response_streams_with_the_sdk_helper(strict, model):
    with strict.responses.stream(model=model, input="say hello to me", store=False) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert final.output_text == MOCK_REPLY and final.status == "completed"
    assert final.usage.output_tokens == MOCK_REPLY_TOKENS


def test_function_calls_and_their_outputs_go_both_ways(strict, model):
    r = strict.responses.create(model=model, input="weather in Paris?", tools=[WEATHER],
                                tool_choice="required", store=False)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "echo"}
    follow = [o.model_dump(exclude_none=True) for o in r.output]
    follow.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"})
    raw = strict.responses.with_raw_response.create(
        model=model, input=[{"role": "user", "content": "weather in Paris?"}, *follow],
        tools=[WEATHER], store=False, extra_headers=ECHO)
    MODELS[model](raw)
    again = raw.parse()
    assert again.output_text and not [o for o in again.output if o.type == "function_call"]


def test_parallel_function_calls_stream_as_their_own_items(strict, model):
    with strict.responses.stream(model=model, input="go", tools=[WEATHER], store=False,
                                 extra_headers={"x-mock-tool-calls": "2"}) as s:
        final = s.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert len(calls) == 2 and len({c.call_id for c in calls}) == 2
    assert all(json.loads(c.arguments) == {"city": "echo"} for c in calls)


def test_reasoning_comes_back_as_a_reasoning_item_and_goes_back_with_its_signature(strict):
    model = "claude-sonnet-5-5"
    r = strict.responses.create(model=model, input="weather?", tools=[WEATHER], store=False,
                                reasoning={"effort": "low"}, max_output_tokens=3000,
                                include=["reasoning.encrypted_content"])
    (item,) = [o for o in r.output if o.type == "reasoning"]
    assert item.summary[0].text and item.encrypted_content
    call = next(o for o in r.output if o.type == "function_call")
    follow = [o.model_dump(exclude_none=True) for o in r.output]
    follow.append({"type": "function_call_output", "call_id": call.call_id, "output": "ok"})
    # The mock refuses a thinking block whose signature is not its own, and a tool turn that
    # lost its thinking.
    again = strict.responses.create(model=model, input=[{"role": "user", "content": "weather?"}, *follow],
                                    tools=[WEATHER], store=False, reasoning={"effort": "low"},
                                    max_output_tokens=3000)
    assert again.status == "completed" and again.output_text


def test_streamed_reasoning_has_its_summary_and_signature(strict):
    with strict.responses.stream(model="claude-sonnet-5-5", input="hi", store=False,
                                 reasoning={"effort": "low"}, max_output_tokens=3000) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.reasoning_summary_text.delta" in kinds
    (item,) = [o for o in final.output if o.type == "reasoning"]
    assert item.summary[0].text and item.encrypted_content


@pytest.mark.parametrize("params, param", [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"text": {"format": {"type": "json_object"}}}, "text"),
])
def test_what_the_pool_cannot_do_is_a_400_naming_it(strict, model, params, param):
    with pytest.raises(openai.BadRequestError) as e:
        strict.responses.create(model=model, input="hi", **params)
    assert e.value.body["param"] == param
    assert e.value.body["code"] == "unsupported_parameter"


def test_a_hosted_tool_is_left_out_and_named_in_a_header(strict, model):
    raw = strict.responses.with_raw_response.create(
        model=model, input="hi", store=False, tools=[{"type": "web_search"}, WEATHER])
    assert raw.headers["x-modelgate-tools-dropped"] == "web_search"
    assert raw.parse().status == "completed"
