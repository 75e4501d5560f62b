"""The web console on the main listener, in headless Chromium as an operator uses it: sign in
wrong and right, create a key and use it on the API within 3 s, lower its rpm and see a 429,
revoke it and see a 401, read usage across keys, models and the audit log. Screenshots of the
console go to target/screenshots (scripts/screenshots.sh writes them into the book).
"""

import json
import time
import urllib.error
import urllib.request

import pytest
from playwright import sync_api as playwright_api

from harness import CONSOLE_PASSWORD, CONSOLE_USER, FULL_KEY, screenshot_path, watch_errors

expect = playwright_api.expect


def call(gateway, path: str, key: str, body=None) -> int:
    url = f"http://127.0.0.1:{gateway.ports['main']}{path}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Authorization", f"Bearer {key}")
    if data:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def chat(gateway, key: str) -> int:
    return call(gateway, "/v1/chat/completions", key,
                {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}]})


def await_status(gateway, key: str, want: int, within_s: float = 3.0) -> None:
    """The API answers `want` for `key` within `within_s` of the console's change."""
    deadline = time.monotonic() + within_s
    while True:
        got = call(gateway, "/v1/models", key)
        if got == want:
            return
        assert time.monotonic() < deadline, f"{got}, wanted {want}"
        time.sleep(0.02)


@pytest.fixture
def console(browser, gateway):
    context = browser.new_context(locale="en-US", viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    problems = watch_errors(pg)
    pg.on("dialog", lambda d: d.accept())
    pg.goto(f"http://127.0.0.1:{gateway.ports['main']}/")
    yield pg
    context.close()
    assert problems == [], problems


def sign_in(pg, password=CONSOLE_PASSWORD):
    pg.get_by_label("User", exact=True).fill(CONSOLE_USER)
    pg.get_by_label("Password", exact=True).fill(password)
    pg.get_by_role("button", name="Sign in").click()


def test_sign_in_wrong_then_right_and_out(console):
    expect(console.get_by_role("button", name="Sign in")).to_be_visible()
    sign_in(console, password="not the password")
    expect(console.locator("#login-status")).to_have_text("Wrong user or password.")
    assert console.locator("#app").is_hidden()
    console.screenshot(path=str(screenshot_path("console-sign-in.png")))
    sign_in(console)
    expect(console.locator("#who")).to_contain_text(f"Signed in as {CONSOLE_USER}")
    expect(console.locator("#keys tbody")).to_contain_text("full")
    # The secret of a key from the file is never on the page; its hint is.
    assert FULL_KEY not in console.content()
    console.get_by_role("button", name="Sign out").click()
    expect(console.get_by_role("button", name="Sign in")).to_be_visible()
    console.reload()
    expect(console.get_by_role("button", name="Sign in")).to_be_visible()


def test_a_new_secret_goes_with_sign_out_and_a_failed_sign_out_says_so(console):
    sign_in(console)
    console.get_by_label("Key ID").fill("shown-once")
    console.get_by_role("button", name="Create key").click()
    expect(console.locator("#secret-box")).to_be_visible()
    secret = console.locator("#secret").inner_text()
    # The gateway cannot be reached: the session stays, and the page says so.
    console.route("**/console/logout", lambda route: route.abort())
    console.get_by_role("button", name="Sign out").click()
    expect(console.locator("#status")).to_contain_text("Not signed out")
    expect(console.locator("#app")).to_be_visible()
    console.unroute("**/console/logout")
    console.get_by_role("button", name="Sign out").click()
    expect(console.get_by_role("button", name="Sign in")).to_be_visible()
    assert secret not in console.content()
    sign_in(console)
    expect(console.locator("#keys tbody")).to_contain_text("shown-once")
    expect(console.locator("#secret-box")).to_be_hidden()
    assert secret not in console.content()


def test_a_key_made_in_the_console_works_then_is_limited_and_revoked(console, gateway):
    sign_in(console)
    expect(console.locator("#keys tbody")).to_contain_text("full")
    console.get_by_label("Key ID").fill("browser-made")
    console.get_by_label("Budget").fill("25")
    console.get_by_label("Expires (UTC)").fill("2031-01-01T00:00:00")
    console.get_by_role("button", name="Create key").click()
    expect(console.locator("#secret-box")).to_be_visible()
    secret = console.locator("#secret").inner_text()
    assert secret.startswith("sk-") and len(secret) == 51
    await_status(gateway, secret, 200)
    row = console.locator("#keys tbody tr", has_text="browser-made")
    expect(row).to_contain_text("25")
    # Shown in the zone it was entered in, named, whatever the browser's zone.
    expect(row).to_contain_text("2031-01-01 00:00 UTC")
    console.screenshot(path=str(screenshot_path("console-keys.png")), full_page=True)

    console.get_by_role("button", name="Edit browser-made").click()
    console.get_by_label("Requests per minute").fill("1")
    console.get_by_role("button", name="Save changes").click()
    expect(console.locator("#status")).to_contain_text("saved")
    expect(row.locator("td").nth(4)).to_have_text("1")
    deadline = time.monotonic() + 3
    while True:
        statuses = (chat(gateway, secret), chat(gateway, secret))
        if statuses[1] == 429:
            break
        assert time.monotonic() < deadline, statuses

    # Deleted while open in the form: the form goes back to a new key.
    console.get_by_role("button", name="Edit browser-made").click()
    expect(console.locator("#key-form-title")).to_have_text("Edit key browser-made")
    console.get_by_role("button", name="Delete browser-made").click()
    expect(console.locator("#status")).to_contain_text("deleted")
    expect(console.locator("#key-form-title")).to_have_text("New key")
    await_status(gateway, secret, 401)
    expect(console.locator("#keys tbody")).not_to_contain_text("browser-made")

    console.get_by_role("button", name="Audit log").click()
    audit = console.locator("#audit tbody")
    expect(audit).to_contain_text("delete")
    text = audit.inner_text()
    assert "create" in text and "update" in text and secret not in text


def test_an_edit_keeps_what_another_editor_changed_meanwhile(console):
    sign_in(console)
    console.get_by_label("Key ID").fill("two-editors")
    console.get_by_label("Expires (UTC)").fill("2031-01-01T00:00:00")
    console.get_by_role("button", name="Create key").click()
    expect(console.locator("#secret-box")).to_be_visible()
    console.get_by_role("button", name="Edit two-editors").click()
    expect(console.locator("#key-form-title")).to_have_text("Edit key two-editors")
    # Another editor, meanwhile, gives it a budget and moves its expiry by 30 s (the form
    # shows minutes, so its expiry field still reads the same).
    other = console.evaluate("""async () => (await fetch("/console/api/keys/two-editors", {
        method: "PATCH", headers: {"content-type": "application/json"},
        body: JSON.stringify({budget: 7, expires_at: "2031-01-01T00:00:30Z"})})).status""")
    assert other == 200
    console.get_by_role("button", name="Save changes").click()
    expect(console.locator("#status")).to_have_text("Nothing changed in key two-editors.")
    console.get_by_label("Requests per minute").fill("5")
    console.get_by_role("button", name="Save changes").click()
    expect(console.locator("#status")).to_contain_text("saved")
    keys = console.evaluate("""async () => (await (await fetch("/console/api/keys")).json()).data""")
    key = next(k for k in keys if k["id"] == "two-editors")
    assert (key["rpm"], key["budget"], key["expires_at"]) == (5, 7, "2031-01-01T00:00:30+00:00"), key


def test_usage_across_keys_and_models(console, gateway):
    assert chat(gateway, FULL_KEY) == 200
    sign_in(console)
    expect(console.locator("#keys tbody")).to_contain_text("full")
    console.get_by_role("button", name="Usage", exact=True).click()
    console.get_by_role("button", name="Query").click()
    expect(console.locator("#status")).to_contain_text("loaded")
    expect(console.locator("#u-by-key tbody")).to_contain_text("full")
    # Each group-by table ends with the totals, and its rows add up to them.
    for table in ("#u-by-key", "#u-by-model", "#u-by-day"):
        total = console.locator(f"{table} tfoot td").nth(1).inner_text().replace(",", "")
        rows = console.locator(f"{table} tbody tr td:nth-child(2)").all_inner_texts()
        assert console.locator(f"{table} tfoot td").first.inner_text() == "Total"
        assert sum(int(r.replace(",", "")) for r in rows) == int(total), table
    assert console.locator("#u-chart canvas").count() >= 1
    assert console.locator("#u-records tbody tr").count() >= 1
    heads = console.locator("#u-records thead th").all_inner_texts()
    assert heads[-2:] == ["Attempts", "Served model"], heads
    widths = console.locator("#u-records tbody tr").evaluate_all(
        "rows => rows.map(r => r.cells.length)")
    assert widths and set(widths) == {len(heads)}, (widths, heads)
    assert console.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    console.screenshot(path=str(screenshot_path("console-usage.png")), full_page=True)
    console.get_by_label("Key", exact=True).select_option("full")
    console.get_by_role("button", name="Query").click()
    expect(console.locator("#status")).to_contain_text("Usage of full loaded")
    keys = console.locator("#u-records tbody tr td:nth-child(3)").all_inner_texts()
    assert keys and set(keys) == {"full"}
    console.get_by_role("button", name="Models").click()
    expect(console.locator("#models tbody")).to_contain_text("echo-1")
    expect(console.locator("#pools tbody")).to_contain_text("local")


def test_the_key_form_on_a_phone_keeps_each_checkbox_with_its_label(browser, gateway):
    context = browser.new_context(locale="en-US", viewport={"width": 390, "height": 844})
    pg = context.new_page()
    problems = watch_errors(pg)
    pg.goto(f"http://127.0.0.1:{gateway.ports['main']}/")
    sign_in(pg)
    expect(pg.locator("#app")).to_be_visible()
    labels = pg.locator("#k-endpoints label.check")
    expect(labels.first).to_be_visible()
    assert labels.count() > 3
    # Each label is one box: its checkbox and its name on one line, whatever wraps between them.
    for i in range(labels.count()):
        label = labels.nth(i)
        box = label.locator("input").bounding_box()
        whole = label.bounding_box()
        rects = label.evaluate("l => l.getClientRects().length")
        assert rects == 1, label.inner_text()
        assert whole["height"] < 2 * box["height"] + 8, (label.inner_text(), whole, box)
    context.close()
    assert problems == [], problems
