"""The conformance suite's adapters: one neutral request (`Ask`) sent through each inbound API's
official SDK (strict response validation), and its reply or stream read back into one neutral
`Got`, so that each feature is checked once for every inbound API and pool kind.

Requests are written from each API's reference: OpenAI's Chat Completions and Responses
(messages / input items, image parts, function tools, reasoning effort, response formats,
stream_options) and Anthropic's Messages (content blocks, tools, thinking, cache_control).
"""

import json
from dataclasses import dataclass, field

import anthropic
import openai

from harness import FULL_KEY

PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
       "RU5ErkJggg==")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# The system prompt the mock counts as cached when it carries cache_control (9 words).
CACHED_SYSTEM = "a long stable system prompt of ten words here"


class Refused(Exception):
    """The gateway refused the request as one the pool cannot honour (400, naming it)."""


@dataclass
class Ask:
    user: str = "say hello to me"
    system: str = "be brief"
    cache_system: bool = False
    image: bool = False
    tools: bool = False
    reasoning: bool = False
    schema: bool = False
    stop: bool = False
    temperature: bool = False
    max_tokens: int = 200
    headers: dict = field(default_factory=dict)
    # API-specific turns after the first user message (a round trip).
    history: list = field(default_factory=list)


@dataclass
class Got:
    text: str = ""
    calls: list = field(default_factory=list)  # [(id, name, arguments as a dict)]
    reasoning: str = ""
    signed: bool = False
    finish: str = ""  # stop | tool | length
    prompt: int = 0
    completion: int = 0
    cached: int = 0
    raw: object = None  # what a round trip sends back


def refused(e: Exception) -> bool:
    """A 400 `unsupported_parameter`: OpenAI's shape names the code, Anthropic's carries it in
    the message."""
    body = getattr(e, "body", None)
    if not isinstance(body, dict):
        return False
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    return (body.get("code") == "unsupported_parameter"
            or "(unsupported_parameter)" in error.get("message", ""))


WEATHER = {"name": "get_weather", "description": "The weather in a city.", "parameters": SCHEMA}


class Chat:
    name = "Chat Completions"

    def __init__(self, base_url):
        self.client = openai.OpenAI(base_url=base_url, api_key=FULL_KEY, max_retries=0,
                                    timeout=30, _strict_response_validation=True)

    def messages(self, ask):
        system = ([{"type": "text", "text": CACHED_SYSTEM, "cache_control": {"type": "ephemeral"}}]
                  if ask.cache_system else ask.system)
        user = ask.user
        if ask.image:
            user = [{"type": "text", "text": ask.user},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
        return [{"role": "system", "content": system}, {"role": "user", "content": user},
                *ask.history]

    def params(self, ask):
        p = {"messages": self.messages(ask), "max_completion_tokens": ask.max_tokens,
             "extra_headers": ask.headers}
        if ask.tools:
            p["tools"] = [{"type": "function", "function": WEATHER}]
        if ask.reasoning:
            p["reasoning_effort"] = "low"
        if ask.schema:
            p["response_format"] = {"type": "json_schema",
                                    "json_schema": {"name": "city", "schema": SCHEMA}}
        if ask.stop:
            p["stop"] = ["END"]
        if ask.temperature:
            p["temperature"] = 0.2
        return p

    def send(self, model, ask, stream):
        got = Got()
        if not stream:
            c = self.client.chat.completions.create(model=model, **self.params(ask))
            m = c.choices[0].message
            extra = m.model_extra or {}
            got.text = m.content or ""
            got.calls = [(t.id, t.function.name, json.loads(t.function.arguments))
                         for t in m.tool_calls or []]
            got.reasoning = extra.get("reasoning_content") or ""
            got.signed = any(b.get("signature") for b in extra.get("thinking_blocks") or [])
            got.finish = c.choices[0].finish_reason
            usage = c.usage
            got.raw = m.model_dump(exclude_none=True)
        else:
            with self.client.chat.completions.stream(
                    model=model, stream_options={"include_usage": True}, **self.params(ask)) as s:
                blocks = []
                for event in s:
                    if event.type == "chunk" and event.chunk.choices:
                        d = event.chunk.choices[0].delta.model_extra or {}
                        got.reasoning += d.get("reasoning_content") or ""
                        blocks += d.get("thinking_blocks") or []
                try:
                    c = s.get_final_completion()
                except openai.LengthFinishReasonError as e:
                    # The helper refuses to parse a reply cut by its limit; it is whole.
                    c = e.completion
            m = c.choices[0].message
            got.text = m.content or ""
            got.calls = [(t.id, t.function.name, json.loads(t.function.arguments))
                         for t in m.tool_calls or []]
            got.signed = any(b.get("signature") for b in blocks)
            got.finish = c.choices[0].finish_reason
            usage = c.usage
            got.raw = {"role": "assistant", "content": m.content,
                       "tool_calls": [t.model_dump() for t in m.tool_calls or []] or None,
                       "thinking_blocks": blocks or None}
            got.raw = {k: v for k, v in got.raw.items() if v is not None}
        got.finish = {"tool_calls": "tool", "length": "length"}.get(got.finish, got.finish)
        got.prompt, got.completion = usage.prompt_tokens, usage.completion_tokens
        got.cached = (usage.prompt_tokens_details.cached_tokens
                      if usage.prompt_tokens_details else 0) or 0
        return got

    def follow(self, got, output):
        return [got.raw, *[{"role": "tool", "tool_call_id": i, "content": output}
                           for i, _, _ in got.calls]]


class Messages:
    name = "Messages"

    def __init__(self, base_url):
        self.client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=FULL_KEY,
                                          max_retries=0, timeout=30,
                                          _strict_response_validation=True)

    def params(self, ask):
        system = ([{"type": "text", "text": CACHED_SYSTEM, "cache_control": {"type": "ephemeral"}}]
                  if ask.cache_system else ask.system)
        user = ask.user
        if ask.image:
            user = [{"type": "text", "text": ask.user},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": PNG}}]
        p = {"system": system, "messages": [{"role": "user", "content": user}, *ask.history],
             "max_tokens": ask.max_tokens, "extra_headers": ask.headers}
        if ask.tools:
            p["tools"] = [{"name": WEATHER["name"], "description": WEATHER["description"],
                           "input_schema": SCHEMA}]
        if ask.reasoning:
            p["thinking"] = {"type": "enabled", "budget_tokens": 1024}
            p["max_tokens"] = max(ask.max_tokens, 2048)
        if ask.schema:
            p["output_config"] = {"format": {"type": "json_schema", "schema": SCHEMA}}
        if ask.stop:
            p["stop_sequences"] = ["END"]
        if ask.temperature:
            p["extra_body"] = {"temperature": 0.2}
        return p

    def send(self, model, ask, stream):
        if stream:
            with self.client.messages.stream(model=model, **self.params(ask)) as s:
                m = s.get_final_message()
        else:
            m = self.client.messages.create(model=model, **self.params(ask))
        got = Got()
        for b in m.content:
            if b.type == "text":
                got.text += b.text
            elif b.type == "tool_use":
                got.calls.append((b.id, b.name, b.input))
            elif b.type == "thinking":
                got.reasoning += b.thinking
                got.signed = got.signed or bool(b.signature)
        got.finish = {"end_turn": "stop", "tool_use": "tool", "max_tokens": "length",
                      "stop_sequence": "stop"}.get(m.stop_reason, m.stop_reason)
        u = m.usage
        got.cached = u.cache_read_input_tokens or 0
        got.prompt = u.input_tokens + got.cached + (u.cache_creation_input_tokens or 0)
        got.completion = u.output_tokens
        got.raw = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]}
        return got

    def follow(self, got, output):
        return [got.raw, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": i, "content": output} for i, _, _ in got.calls]}]


class Responses:
    name = "Responses"

    def __init__(self, base_url):
        self.client = openai.OpenAI(base_url=base_url, api_key=FULL_KEY, max_retries=0,
                                    timeout=30, _strict_response_validation=True)

    def params(self, ask):
        content = [{"type": "input_text", "text": ask.user}]
        if ask.image:
            content.append({"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"})
        system = CACHED_SYSTEM if ask.cache_system else ask.system
        p = {"instructions": system, "input": [{"role": "user", "content": content}, *ask.history],
             "max_output_tokens": ask.max_tokens, "store": False, "extra_headers": ask.headers}
        if ask.tools:
            p["tools"] = [{"type": "function", **WEATHER}]
        if ask.reasoning:
            p["reasoning"] = {"effort": "low"}
            p["max_output_tokens"] = max(ask.max_tokens, 2048)
        if ask.schema:
            p["text"] = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}}
        if ask.stop:
            raise Refused("the Responses API has no stop sequences")
        if ask.temperature:
            p["temperature"] = 0.2
        return p

    def send(self, model, ask, stream):
        if stream:
            # The SDK's stream helper waits for `response.completed`; a reply cut by its limit
            # ends with `response.incomplete`, as the API sends it.
            r = None
            for event in self.client.responses.create(model=model, stream=True, **self.params(ask)):
                if event.type in ("response.completed", "response.incomplete"):
                    r = event.response
            assert r is not None, "no terminal event"
        else:
            r = self.client.responses.create(model=model, **self.params(ask))
        got = Got(text=r.output_text)
        for o in r.output:
            if o.type == "function_call":
                got.calls.append((o.call_id, o.name, json.loads(o.arguments)))
            elif o.type == "reasoning":
                got.reasoning += "".join(s.text for s in o.summary)
                got.signed = got.signed or bool(o.encrypted_content)
        got.finish = ("tool" if got.calls else
                      "length" if r.status == "incomplete" else "stop")
        got.prompt, got.completion = r.usage.input_tokens, r.usage.output_tokens
        got.cached = r.usage.input_tokens_details.cached_tokens
        got.raw = [o.model_dump(exclude_none=True) for o in r.output]
        return got

    def follow(self, got, output):
        return [*got.raw, *[{"type": "function_call_output", "call_id": i, "output": output}
                            for i, _, _ in got.calls]]


def send(api, model, ask, stream):
    """The reply, or Refused when the gateway refused what the pool cannot honour."""
    try:
        return api.send(model, ask, stream)
    except (openai.BadRequestError, anthropic.BadRequestError) as e:
        if refused(e):
            raise Refused(str(e)) from e
        raise
