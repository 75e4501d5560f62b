"""Fixtures shared by the Python suites: one gateway for the whole session (see harness.py)."""

import os
import shutil
from pathlib import Path

import openai
import pytest

from harness import FULL_KEY, REPO_ROOT, start_gateway, stop


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    binary = Path(os.environ.get("MODELGATE_BIN", "target/debug/modelgate"))
    if not binary.is_absolute():
        binary = REPO_ROOT / binary
    if not binary.is_file():
        pytest.fail(f"gateway binary {binary} not found: run `cargo build` or set MODELGATE_BIN")
    gw, why = start_gateway(binary, tmp_path_factory.mktemp("gateway"))
    if why is not None:
        pytest.fail(f"gateway did not start ({gw.ports}): {why}; stderr:\n{gw.stderr()}",
                    pytrace=False)
    yield gw
    stop(gw.process)


@pytest.fixture(params=["main", "direct"])
def base_url(request, gateway):
    return gateway.base_url(request.param)


@pytest.fixture
def client_for(base_url):
    """client_for(key): an SDK client on this listener. No retries: an error must surface."""
    clients = []

    def make(api_key: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(client_for):
    return client_for(FULL_KEY)


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("chromium is not installed: run scripts/install-deps.sh --test")
    return path


@pytest.fixture(scope="session")
def browser():
    """Debian's headless Chromium, driven by playwright (no browser download)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), headless=True,
                              args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()

