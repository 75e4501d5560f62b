"""A client of modelgate that follows the API's own guidance, with the official OpenAI SDK.

- Probe `GET /v1/models` on each base in order (`main`, then `direct`) and use the first that
  answers; a refused key is not a reason to try the next base.
- Retry only 429 and 5xx (and a connection that failed), never another 4xx, with one of the
  two backoff policies; a `Retry-After` the gateway sends is waited at least.
- A timeout on every call, a longer one for streams.
- Cancel a stream by closing it; reconnect after a dropped stream by asking again.
"""

import random
import time

import httpx
import openai

# The SDK's own retries are off: the policies below are the API's.
PLAIN_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
STREAM_TIMEOUT = httpx.Timeout(600.0, connect=5.0, read=120.0)


def connect(bases, api_key, timeout=PLAIN_TIMEOUT):
    """The first base whose `GET /v1/models` answers, as an SDK client."""
    last = None
    for base in bases:
        client = openai.OpenAI(base_url=base, api_key=api_key, max_retries=0, timeout=timeout)
        try:
            client.models.list()
            return client
        except openai.AuthenticationError:
            client.close()
            raise  # the key is wrong on every base
        except (openai.APIConnectionError, openai.InternalServerError) as e:
            client.close()
            last = e
    raise last or ValueError("no base given")


def short_policy(attempt):
    """2 ** attempt seconds, 3 attempts."""
    return (2.0 ** attempt) if attempt < 3 else None


def long_policy(attempt):
    """min(2 ** attempt, 60) seconds plus up to 10% jitter, 5 attempts."""
    if attempt >= 5:
        return None
    delay = min(2.0 ** attempt, 60.0)
    return delay + random.uniform(0, delay * 0.1)


def retryable(error):
    if isinstance(error, openai.APIStatusError):
        return error.status_code == 429 or error.status_code >= 500
    return isinstance(error, (openai.APIConnectionError, httpx.TransportError))


def with_retries(call, policy=short_policy, sleep=time.sleep):
    """call() under `policy`: the wait after attempt n (from 1), or None to give up."""
    attempt = 1
    while True:
        try:
            return call()
        except Exception as e:  # noqa: BLE001 - sorted by retryable()
            wait = policy(attempt) if retryable(e) else None
            if wait is None:
                raise
            retry_after = getattr(getattr(e, "response", None), "headers", {}).get("retry-after")
            if retry_after and retry_after.isdigit():
                wait = max(wait, float(retry_after))
            sleep(wait)
            attempt += 1


def chat(client, model, content, policy=short_policy, sleep=time.sleep):
    """One plain chat completion's text."""
    reply = with_retries(
        lambda: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}]
        ),
        policy,
        sleep,
    )
    return reply.choices[0].message.content


def stream_chat(client, model, content, extra_headers=None, stop_after=None):
    """A streamed chat's text. `stop_after` characters cancel it: closing the stream ends the
    request, and the gateway bills what the upstream did until then."""
    text = ""
    stream = client.with_options(timeout=STREAM_TIMEOUT).chat.completions.create(
        model=model,
        stream=True,
        messages=[{"role": "user", "content": content}],
        extra_headers=extra_headers or {},
    )
    with stream:
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if stop_after is not None and len(text) >= stop_after:
                break  # leaving the `with` closes the connection: the request is cancelled
    return text


def stream_with_reconnect(start, attempts=3, sleep=time.sleep):
    """start() runs a stream to its end; a stream dropped half-way is asked for again (from
    the start: the half already received is billed as its own request)."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except (openai.APIConnectionError, httpx.TransportError):
            if attempt == attempts:
                raise
            sleep(short_policy(attempt) or 0)
