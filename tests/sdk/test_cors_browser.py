"""CORS from a real browser: a page on another origin calls the API with a bearer key in
headless Chromium. The allowed origin gets its answer (after the browser's preflight); a page
on an origin not in `[cors] allow_origins` is refused by the browser."""

import http.server
import threading

import pytest

from harness import FULL_KEY

PAGE = """<!doctype html><meta charset="utf-8"><title>app</title><script>
window.result = undefined;
fetch(%(url)r, {
  method: "POST",
  headers: {"Authorization": "Bearer %(key)s", "Content-Type": "application/json"},
  body: JSON.stringify({model: "echo-1", messages: [{role: "user", content: "hi"}]})
}).then(async r => { window.result = {status: r.status, id: r.headers.get("x-request-id"),
                                     body: await r.json()}; })
  .catch(e => { window.result = {error: String(e)}; });
</script>"""


@pytest.fixture
def serve_page():
    servers = []

    def start(port: int, html: str) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = html.encode()
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{port}/"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def run_page(browser, url: str) -> dict:
    page = browser.new_page()
    try:
        page.goto(url)
        page.wait_for_function("window.result !== undefined", timeout=15_000)
        return page.evaluate("window.result")
    finally:
        page.close()


@pytest.mark.parametrize("listener", ["main", "direct"])
def test_an_allowed_origin_calls_the_api_from_the_browser(browser, gateway, serve_page, listener):
    api = f"{gateway.base_url(listener)}/chat/completions"
    html = PAGE % {"url": api, "key": FULL_KEY}
    app = serve_page(gateway.ports["app"], html)
    result = run_page(browser, app)
    assert result.get("status") == 200, result
    assert result["id"].startswith("req_"), result  # an exposed header the page can read
    assert result["body"]["choices"][0]["message"]["content"], result


def test_an_origin_not_allowed_is_refused_by_the_browser(browser, gateway, serve_page):
    api = f"{gateway.base_url('main')}/chat/completions"
    html = PAGE % {"url": api, "key": FULL_KEY}
    other = serve_page(gateway.ports["other_app"], html)
    result = run_page(browser, other)
    assert "error" in result and "status" not in result, result
