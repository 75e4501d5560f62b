"""The client guide's example (docs/src/examples/client.py) run against the gateway: the probe
and its fallback, which errors are retried and how long it waits, timeouts, cancelling a
stream and asking again after a dropped one."""

import importlib.util

import openai
import pytest

from harness import FULL_KEY, GUIDE_RATE_KEY, REPO_ROOT, UNKNOWN_KEY, free_ports

spec = importlib.util.spec_from_file_location(
    "client_guide", REPO_ROOT / "docs" / "src" / "examples" / "client.py"
)
guide = importlib.util.module_from_spec(spec)
spec.loader.exec_module(guide)


@pytest.fixture
def dead_base():
    (port,) = free_ports(1)
    return f"http://127.0.0.1:{port}/v1"


def test_the_probe_takes_the_first_base_that_answers(gateway, dead_base):
    main, direct = gateway.base_url("main"), gateway.base_url("direct")
    with guide.connect([main, direct], FULL_KEY) as client:
        assert str(client.base_url).rstrip("/") == main
    with guide.connect([dead_base, direct], FULL_KEY) as client:
        assert str(client.base_url).rstrip("/") == direct
        assert guide.chat(client, "echo-1", "Hello there") != ""


def test_a_refused_key_ends_the_probe_instead_of_moving_on(gateway, dead_base):
    # Had it moved on, the dead base's connection error would be raised instead.
    with pytest.raises(openai.AuthenticationError):
        guide.connect([gateway.base_url("main"), dead_base], UNKNOWN_KEY)


def test_4xx_is_not_retried_and_429_is_with_the_short_policy(gateway):
    waits, calls = [], []
    with openai.OpenAI(base_url=gateway.base_url("direct"), api_key=FULL_KEY, max_retries=0) as c:
        def unknown_model():
            calls.append(1)
            return c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])

        with pytest.raises(openai.NotFoundError):
            guide.with_retries(unknown_model, sleep=waits.append)
        assert (len(calls), waits) == (1, [])

    with openai.OpenAI(base_url=gateway.base_url("direct"), api_key=GUIDE_RATE_KEY, max_retries=0) as c:
        seen = []

        def limited():
            try:
                return c.chat.completions.create(model="echo-1", messages=[{"role": "user", "content": "x"}])
            except openai.RateLimitError as e:
                seen.append(int(e.response.headers["retry-after"]))
                raise

        limited()  # rpm = 1: the first goes through, the next ones in the minute are 429
        with pytest.raises(openai.RateLimitError):
            guide.with_retries(limited, sleep=waits.append)
    # Three attempts, two waits: 2 and 4 s, or the longer Retry-After the gateway sent.
    assert len(seen) == 3 and len(waits) == 2, (seen, waits)
    assert waits == [max(2.0, seen[0]), max(4.0, seen[1])]


def test_the_long_policy_waits_grow_to_a_minute_with_a_tenth_of_jitter():
    for attempt, base in [(1, 2), (2, 4), (3, 8), (4, 16)]:
        for _ in range(50):
            assert base <= guide.long_policy(attempt) <= base * 1.1
    assert guide.long_policy(5) is None
    assert guide.short_policy(3) is None


def test_a_stream_is_cancelled_by_closing_it_and_asked_again_after_a_drop(gateway):
    with guide.connect([gateway.base_url("main")], FULL_KEY) as client:
        whole = guide.stream_chat(client, "echo-1", "one two three four five six seven")
        assert whole != ""
        part = guide.stream_chat(client, "echo-1", "one two three four five six seven", stop_after=1)
        assert 1 <= len(part) < len(whole)

        starts, waits = [], []

        def start():
            starts.append(1)
            # The first try's stream drops after two events (the mock cuts it).
            cut = {"x-mock-cut-after": "2"} if len(starts) == 1 else {}
            return guide.stream_chat(client, "echo-1", "one two three four five six seven", cut)

        assert guide.stream_with_reconnect(start, sleep=waits.append) == whole
        assert (len(starts), waits) == (2, [2.0])
