"""The official OpenAI Python SDK, unchanged, over HTTPS to both listeners (`[listeners.tls.*]`):
the private CA of the test is trusted the standard way (SSL_CERT_FILE), HTTP/1.1 by default and
HTTP/2 when the SDK's HTTP client is asked for it (ALPN), plain and streamed replies."""

import os

import openai
import pytest

from harness import FULL_KEY, MOCK_REPLY, REPO_ROOT, make_certificate, start_gateway, stop


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory):
    binary = REPO_ROOT / os.environ.get("MODELGATE_BIN", "target/debug/modelgate")
    workdir = tmp_path_factory.mktemp("tls-gateway")
    tls = make_certificate(workdir)
    gw, why = start_gateway(binary, workdir, tls)
    if why is not None:
        pytest.fail(f"TLS gateway did not start: {why}\n{gw.stderr()}", pytrace=False)
    yield gw, tls
    stop(gw.process)


@pytest.fixture(params=["main", "direct"])
def https_url(request, tls_gateway, monkeypatch):
    gw, tls = tls_gateway
    monkeypatch.setenv("SSL_CERT_FILE", str(tls["ca"]))
    url = gw.base_url(request.param)
    assert url.startswith("https://")
    return url


def test_the_sdk_talks_https_plain_and_streamed(https_url):
    with openai.OpenAI(base_url=https_url, api_key=FULL_KEY, max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="echo-1", messages=[{"role": "user", "content": "hi"}])
        assert raw.http_response.http_version == "HTTP/1.1"
        assert raw.parse().choices[0].message.content == MOCK_REPLY
        stream = client.chat.completions.create(
            model="echo-1", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == MOCK_REPLY
        assert chunks[-1].usage.completion_tokens == 8


def test_the_sdk_talks_http2_when_its_client_asks_for_it(https_url):
    http_client = openai.DefaultHttpxClient(http2=True)
    with openai.OpenAI(base_url=https_url, api_key=FULL_KEY, max_retries=0,
                       http_client=http_client) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="echo-1", messages=[{"role": "user", "content": "hi"}])
        assert raw.http_response.http_version == "HTTP/2"
        assert raw.parse().choices[0].message.content == MOCK_REPLY
        with client.chat.completions.with_streaming_response.create(
                model="echo-1", messages=[{"role": "user", "content": "hi"}],
                stream=True) as response:
            assert response.http_response.http_version == "HTTP/2"
            text = "".join(c.choices[0].delta.content or ""
                           for c in response.parse() if c.choices)
        assert text == MOCK_REPLY
        models = [m.id for m in client.models.list()]
        assert "echo-1" in models


def test_an_untrusted_certificate_is_refused_by_the_sdk(tls_gateway, monkeypatch):
    gw, _ = tls_gateway
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with openai.OpenAI(base_url=gw.base_url("main"), api_key=FULL_KEY, max_retries=0) as client:
        with pytest.raises(openai.APIConnectionError):
            client.models.list()
