"""The usage-record page on the direct listener, driven in headless Chromium (Debian's, through
playwright) as a person would use it: query with a token, read the totals, chart, models and
records, switch the time zone, export the CSV, and see bad tokens, empty ranges and failures
said in words. The browser runs in Asia/Kolkata (+05:30) so zone handling is exercised.

A screenshot of the page is written for the book (see scripts/screenshots.sh).
"""

import json
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest

from playwright import sync_api as playwright_api

from harness import ECHO_ONLY_KEY, PAGE_KEY, screenshot_path, watch_errors

MARKUP_MODEL = '<img src=x onerror="window.__xss=1">'
IST = timezone(timedelta(hours=5, minutes=30))


def api(gateway, path: str, key: str = PAGE_KEY, body=None):
    """(status, bytes, headers) of a request to the direct listener."""
    url = f"http://127.0.0.1:{gateway.ports['direct']}{path}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET")
    req.add_header("Authorization", f"Bearer {key}")
    if data:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


@pytest.fixture(scope="module")
def seeded(gateway):
    """Chats for the page's key, one with a markup model name (a 404 that is still a record)."""
    for model in ["echo-1", "echo-1", "demo-large", MARKUP_MODEL]:
        status, _, _ = api(gateway, "/v1/chat/completions", body={
            "model": model, "messages": [{"role": "user", "content": "hello page"}]})
        assert status in (200, 404), status
    # Wait until the store has all four (the writer commits every 100 ms).
    deadline = datetime.now() + timedelta(seconds=10)
    while True:
        _, body, _ = api(gateway, "/api/usage?limit=10000")
        chats = [r for r in json.loads(body)["data"] if r["endpoint"] == "chat"]
        if len(chats) >= 4:
            return chats
        assert datetime.now() < deadline, chats
        time.sleep(0.05)


@pytest.fixture
def page(browser, gateway, seeded):
    context = browser.new_context(timezone_id="Asia/Kolkata", locale="en-US",
                                  accept_downloads=True, viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    problems = watch_errors(pg)
    pg.goto(f"http://127.0.0.1:{gateway.ports['direct']}/")
    yield pg
    context.close()
    # No CSP violation, no script error, on any page of the test.
    assert problems == [], problems


def run_query(pg, token=PAGE_KEY):
    pg.get_by_label("Token", exact=True).fill(token)
    pg.get_by_role("button", name="Query").click()


def wall(value: str) -> datetime:
    # Chromium leaves the seconds out of a datetime-local value when they are zero.
    return datetime.fromisoformat(value)


def test_query_shows_the_key_totals_chart_models_and_every_record_field(page, seeded):
    run_query(page)
    status = page.locator("#status")
    playwright_api.expect(status).to_contain_text("Usage from")
    facts = page.locator("#key-facts").inner_text()
    assert "page" in facts and "50" in facts and "600" in facts and "Never" in facts, facts
    totals = page.locator("#total-facts").inner_text()
    assert "Requests" in totals and "Success rate" in totals and "Latency p95" in totals, totals
    assert page.locator("#chart canvas").count() >= 1
    models = page.locator("#models tbody").inner_text()
    assert "echo-1" in models and "demo-large" in models
    rows = page.locator("#records tbody tr")
    assert rows.count() >= 4
    # One header per record field, and every row as wide as the header.
    heads = page.locator("#records thead th").all_inner_texts()
    assert len(heads) == 18 and heads[-2:] == ["Attempts", "Served model"], heads
    for i in range(rows.count()):
        assert rows.nth(i).locator("td").count() == len(heads)
    # A table wider than the window scrolls in its panel; the page itself never does.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    ids = page.locator("#records tbody tr td:nth-child(2)").all_inner_texts()
    for r in seeded:
        assert r["request_id"] in ids
    # Costs as short decimals, small ones too: never an exponent or a binary fraction's tail.
    costs = page.locator("#records tbody tr td:nth-child(12)").all_inner_texts()
    assert all("e" not in c and len(c) <= 12 for c in costs), costs
    # The page's cost format: a small cost is never shown as 0, a large one keeps six decimals.
    shown = page.evaluate("[2e-7, 0.000019999999999999998, 0.0014981, 1234.5678901].map(window.MG.credits)")
    assert shown == ["0.0000002", "0.00002", "0.0014981", "1,234.56789"], shown
    page.screenshot(path=str(screenshot_path("usage-page.png")), full_page=True)


def test_a_model_name_made_of_markup_shows_as_text_and_runs_nothing(page):
    run_query(page)
    playwright_api.expect(page.locator("#status")).to_contain_text("Usage from")
    assert MARKUP_MODEL in page.locator("#records tbody").inner_text()
    # A model the gateway does not serve is summed under "(unknown)" in the breakdown.
    assert "(unknown)" in page.locator("#models tbody").inner_text()
    assert page.locator("#records img, #models img").count() == 0
    assert page.evaluate("window.__xss") is None


def test_the_time_zone_is_the_browsers_shown_and_switchable_to_utc(page, seeded):
    # Chromium's ICU may name the zone by its older alias; both are the same +05:30.
    zone_name = page.locator("#tz-shown").inner_text()
    assert zone_name in ("Asia/Kolkata (UTC+05:30)", "Asia/Calcutta (UTC+05:30)"), zone_name
    ist_from = wall(page.get_by_label("From", exact=True).input_value())
    run_query(page)
    playwright_api.expect(page.locator("#status")).to_contain_text("Usage from")
    newest = seeded[-1]
    shown = page.locator("#records tbody tr").filter(has_text=newest["request_id"]).locator("td").first.inner_text()
    utc_time = datetime.fromisoformat(newest["time"].replace("Z", "+00:00"))
    assert shown == utc_time.astimezone(IST).strftime("%Y-%m-%d %H:%M:%S")
    assert zone_name.split(" ")[0] in page.locator("#chart-note").inner_text()
    page.get_by_label("Time zone", exact=True).select_option("UTC")
    assert "UTC (UTC+00:00)" in page.locator("#tz-shown").inner_text()
    utc_from = wall(page.get_by_label("From", exact=True).input_value())
    assert ist_from - utc_from == timedelta(hours=5, minutes=30), "same instant, new wall time"
    # The page queries again in the new zone; wait for that query to finish (its records come
    # after its chart), then the same record shows its UTC time.
    playwright_api.expect(page.locator("#status")).to_contain_text("(UTC)")
    playwright_api.expect(page.locator("#chart-note")).to_contain_text("UTC")
    cell = page.locator("#records tbody tr").filter(has_text=newest["request_id"]).locator("td").first
    playwright_api.expect(cell).to_have_text(utc_time.strftime("%Y-%m-%d %H:%M:%S"))


def test_export_downloads_exactly_the_selected_range(page, gateway, seeded):
    # A range that ends now: records made later (the export's own) fall outside it.
    now = datetime.now(IST).replace(microsecond=0)
    page.get_by_label("From", exact=True).fill((now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S"))
    page.get_by_label("To", exact=True).fill(now.strftime("%Y-%m-%dT%H:%M:%S"))
    page.get_by_label("Token", exact=True).fill(PAGE_KEY)
    with page.expect_request("**/api/usage.csv?**") as req, page.expect_download() as dl:
        page.get_by_role("button", name="Export CSV").click()
    got = open(dl.value.path(), "rb").read()
    query = urllib.parse.urlsplit(req.value.url).query
    params = urllib.parse.parse_qs(query)
    start = datetime.fromisoformat(params["start"][0].replace("Z", "+00:00"))
    end = datetime.fromisoformat(params["end"][0].replace("Z", "+00:00"))
    assert end == now.astimezone(timezone.utc) and end - start == timedelta(hours=1)
    status, want, headers = api(gateway, f"/api/usage.csv?{query}")
    assert status == 200 and got == want
    lines = got.decode().splitlines()
    assert lines[0].startswith("time,request_id,key_id,listener,endpoint,model,status")
    for r in seeded:
        assert any(r["request_id"] in line for line in lines[1:])
    name = dl.value.suggested_filename
    assert name == f"usage-page-{start:%Y%m%dT%H%M%S}Z-{end:%Y%m%dT%H%M%S}Z.csv", name
    playwright_api.expect(page.locator("#status")).to_contain_text("Exported")


def test_a_bad_token_an_empty_range_and_a_failed_request_are_said_in_words(page, gateway):
    run_query(page, token="sk-not-a-real-key-0000")
    playwright_api.expect(page.locator("#status")).to_contain_text("not accepted (401)")
    assert page.locator("#results").is_hidden()

    page.get_by_label("From", exact=True).fill("2020-01-01T00:00:00")
    page.get_by_label("To", exact=True).fill("2020-01-02T00:00:00")
    run_query(page)
    playwright_api.expect(page.locator("#empty")).to_contain_text("No usage records between 2020-01-01 00:00:00")
    assert page.locator("#filled").is_hidden()
    assert page.locator("#records tbody tr").count() == 0

    page.route("**/api/usage/summary**", lambda route: route.abort())
    page.get_by_role("button", name="Last 24 hours").click()
    playwright_api.expect(page.locator("#status")).to_contain_text("The request failed")
    assert page.locator("#results").is_hidden()


def test_load_more_goes_on_with_the_key_queried_and_a_refused_query_hides_the_results(page, gateway):
    # More records than a page of the list (50) for another key.
    for _ in range(60):
        status, _, _ = api(gateway, "/v1/chat/completions", key=ECHO_ONLY_KEY, body={
            "model": "echo-1", "messages": [{"role": "user", "content": "more"}]})
        assert status == 200, status
    deadline = time.monotonic() + 10
    while len(json.loads(api(gateway, "/api/usage?limit=100", key=ECHO_ONLY_KEY)[1])["data"]) < 60:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    run_query(page, token=ECHO_ONLY_KEY)
    playwright_api.expect(page.locator("#more")).to_be_visible()
    # Another token in the field: "Load more" still lists the key that was queried.
    page.get_by_label("Token", exact=True).fill(PAGE_KEY)
    page.get_by_role("button", name="Load more").click()
    # A 51st row (a locator's wait: the page's CSP refuses a polled string predicate).
    playwright_api.expect(page.locator("#records tbody tr").nth(50)).to_be_attached()
    keys = page.locator("#records tbody tr td:nth-child(3)").all_inner_texts()
    assert set(keys) == {"echo-only"}, set(keys)
    # A query the page refuses leaves no earlier results on screen.
    page.get_by_label("From", exact=True).fill("2026-01-02T00:00:00")
    page.get_by_label("To", exact=True).fill("2026-01-01T00:00:00")
    page.get_by_role("button", name="Query").click()
    playwright_api.expect(page.locator("#status")).to_contain_text("From must be before To.")
    assert page.locator("#results").is_hidden()


def test_times_the_clocks_skip_or_repeat_are_read_the_same_way_in_every_zone(page):
    """A wall time a DST change skips moves forward by the skip; one it repeats is the first."""
    cases = [
        # Skipped: 02:30 in New York, 01:30 in London, both one hour later.
        ("2026-03-08T02:30", "America/New_York", "2026-03-08T07:30:00.000Z"),
        ("2026-03-29T01:30", "Europe/London", "2026-03-29T01:30:00.000Z"),
        # Twice: the first one, in summer time.
        ("2026-11-01T01:30", "America/New_York", "2026-11-01T05:30:00.000Z"),
        ("2026-10-25T01:30", "Europe/London", "2026-10-25T00:30:00.000Z"),
        # Ordinary times, and a zone with no DST.
        ("2026-07-01T12:00", "America/New_York", "2026-07-01T16:00:00.000Z"),
        ("2026-07-01T12:00", "Asia/Kolkata", "2026-07-01T06:30:00.000Z"),
    ]
    for value, tz, want in cases:
        got = page.evaluate("([v, tz]) => new Date(MG.parseInput(v, tz)).toISOString()", [value, tz])
        assert got == want, (value, tz, got)
