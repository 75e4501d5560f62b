// The usage-record page (direct listener, GET /). Vanilla JS, no inline script (strict CSP).
// Everything that came from the server is put into the page with textContent, never as HTML.
// The token lives only in the input and in the Authorization header of our own requests.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const { offsetText, wall, inputValue, parseInput, qs, fact, num, credits } = window.MG;
  const BROWSER_TZ = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  const PAGE_SIZE = 50;
  const FIELDS = ["time", "request_id", "key_id", "listener", "endpoint", "model", "status", "stream",
    "prompt_tokens", "completion_tokens", "total_tokens", "cost", "latency_ms", "ttft_ms", "upstream", "estimated", "attempts", "served_model"];

  // tz: the zone the From/To inputs and every time on the page are in. `shown`: the token and
  // range of the results on the page, so "Load more" goes on with them whatever the inputs
  // hold by then.
  const state = { startMs: 0, endMs: 0, cursor: null, chart: null, shownRange: null, tz: BROWSER_TZ, shown: null };

  function zone() {
    return state.tz;
  }

  function showTime(ms) {
    const tz = zone();
    const w = wall(ms, tz);
    return `${w.year}-${w.month}-${w.day} ${w.hour}:${w.minute}:${w.second}`;
  }

  function showZone() {
    const tz = zone();
    const label = `${tz} (UTC${offsetText(Date.now(), tz)})`;
    $("tz-shown").textContent = label;
    $("tz-browser").textContent = `This browser: ${BROWSER_TZ}`;
  }

  function setRange(startMs, endMs) {
    state.startMs = startMs;
    state.endMs = endMs;
    $("from").value = inputValue(startMs, zone());
    $("to").value = inputValue(endMs, zone());
  }

  function readRange() {
    const s = parseInput($("from").value, zone());
    const e = parseInput($("to").value, zone());
    if (Number.isNaN(s) || Number.isNaN(e)) return "Enter both From and To.";
    if (s >= e) return "From must be before To.";
    state.startMs = s;
    state.endMs = e;
    return null;
  }

  function say(text, kind) {
    const el = $("status");
    el.textContent = text;
    el.className = "status" + (kind ? " " + kind : "");
  }

  // A key is printable ASCII (`sk-` and letters, digits, `-`, `_`); anything else was pasted
  // by mistake (and a browser cannot even send it in a header).
  function oddToken() {
    return /[^\x21-\x7e]/.test($("token").value.trim())
      ? "This token has characters no key has (a key is letters, digits, '-' and '_'): check what was pasted."
      : null;
  }

  function rangeParams() {
    return {
      start: new Date(state.startMs).toISOString(),
      end: new Date(state.endMs).toISOString(),
    };
  }

  // Our own API call with the token in the header (the input's, unless given). Resolves to the
  // Response, or throws an Error whose message is meant for a person.
  async function call(path, params, token = $("token").value.trim()) {
    let res;
    try {
      res = await fetch(`${path}?${qs(params)}`, {
        headers: { Authorization: `Bearer ${token}` },
        cache: "no-store",
        credentials: "omit",
        referrerPolicy: "no-referrer",
      });
    } catch (e) {
      throw new Error(`The request failed before the gateway answered (${e.message}). Check the connection and try again.`);
    }
    if (res.ok) return res;
    let detail = "";
    try {
      const body = await res.json();
      detail = (body && body.error && body.error.message) || "";
    } catch (_) { /* not JSON */ }
    if (res.status === 401) throw new Error("This token was not accepted (401): it is unknown, disabled or expired.");
    if (res.status === 403) throw new Error(`This token may not read usage (403). ${detail}`);
    if (res.status === 429) {
      const wait = res.headers.get("retry-after");
      throw new Error(`Too many attempts (429). Try again${wait ? ` in ${wait} s` : " later"}. ${detail}`);
    }
    throw new Error(`The gateway answered ${res.status}: ${detail || res.statusText}`);
  }

  function renderKey(k) {
    const dl = $("key-facts");
    dl.replaceChildren();
    fact(dl, "Key", k.id);
    fact(dl, "Budget", k.budget === null ? "No budget (unlimited)" : credits(k.budget));
    fact(dl, "Spent", credits(k.spend));
    fact(dl, "Remaining", k.remaining === null ? "Unlimited" : credits(k.remaining));
    fact(dl, "Requests per minute", k.rpm === null ? "No limit" : num(k.rpm));
    fact(dl, "Tokens per minute", k.tpm === null ? "No limit" : num(k.tpm));
    fact(dl, "Concurrent requests", k.max_concurrent === null ? "No limit" : num(k.max_concurrent));
    fact(dl, "Expires", k.expires_at === null ? "Never" : showTime(Date.parse(k.expires_at)));
    fact(dl, "Models", (k.models || []).join(", "));
  }

  function renderTotals(t) {
    MG.totals($("total-facts"), t);
  }

  function renderChart(summary) {
    const unit = summary.range.bucket === "15m" ? "quarter hour" : summary.range.bucket;
    $("chart-note").textContent = `${summary.buckets.length} buckets of one ${unit}, in ${summary.range.tz}.`;
    state.chart = MG.chart($("chart"), summary, zone(), state.chart);
  }

  function renderModels(models) {
    const body = $("models").tBodies[0];
    body.replaceChildren();
    for (const m of models) {
      const tr = body.insertRow();
      const rate = m.requests ? `${((m.succeeded / m.requests) * 100).toFixed(1)}%` : "—";
      for (const v of [m.model || "(none)", num(m.requests), rate, num(m.prompt_tokens), num(m.completion_tokens),
        num(m.total_tokens), credits(m.cost), m.latency_p50_ms === null ? "—" : `${num(m.latency_p50_ms)} ms`]) {
        tr.insertCell().textContent = v;
      }
    }
  }

  function appendRecords(rows) {
    const body = $("records").tBodies[0];
    for (const r of rows) {
      const tr = body.insertRow();
      for (const f of FIELDS) {
        let v = r[f];
        if (f === "time") v = showTime(Date.parse(v));
        else if (f === "cost") v = credits(v);
        else if (v === null || v === undefined) v = "—";
        else if (typeof v === "boolean") v = v ? "yes" : "no";
        const td = tr.insertCell();
        td.textContent = String(v);
        if (f === "status" && r.status >= 400) td.className = "bad";
      }
    }
  }

  async function loadRecords(first) {
    const { token, range } = state.shown;
    const params = { ...range, order: "desc", limit: PAGE_SIZE };
    if (!first && state.cursor) params.cursor = state.cursor;
    const res = await call("/api/usage", params, token);
    const page = await res.json();
    if (first) $("records").tBodies[0].replaceChildren();
    appendRecords(page.data);
    state.cursor = page.has_more ? page.next_cursor : null;
    $("more").hidden = !page.has_more;
    const shown = $("records").tBodies[0].rows.length;
    $("records-note").textContent = page.has_more
      ? `Showing the newest ${num(shown)} records; more follow.`
      : `All ${num(shown)} records of the range are shown.`;
  }

  async function query(ev) {
    if (ev) ev.preventDefault();
    // Results of an earlier query (maybe another key's) never stay under a refused one.
    const refuse = (text, focus) => {
      $("results").hidden = true;
      state.shown = null;
      say(text, "error");
      if (focus) $("token").focus();
    };
    if (!$("token").value.trim()) return refuse("Enter a token first.", true);
    if (oddToken()) return refuse(oddToken(), true);
    const bad = readRange();
    if (bad) return refuse(bad);
    state.endMs = MG.endingNow(state.startMs, state.endMs);
    state.shown = { token: $("token").value.trim(), range: rangeParams() };
    say("Loading…");
    $("query").disabled = true;
    try {
      const res = await call("/api/usage/summary", { ...state.shown.range, tz: zone() }, state.shown.token);
      const summary = await res.json();
      $("results").hidden = false;
      renderKey(summary.key);
      const from = showTime(state.startMs), to = showTime(state.endMs);
      state.shownRange = `${from} – ${to} (${zone()})`;
      if (summary.totals.requests === 0) {
        $("filled").hidden = true;
        $("empty").hidden = false;
        $("empty").textContent = `No usage records between ${from} and ${to} (${zone()}).`;
        say(`No records in the range.`);
        return;
      }
      $("empty").hidden = true;
      $("filled").hidden = false;
      renderTotals(summary.totals);
      renderModels(summary.models);
      renderChart(summary);
      await loadRecords(true);
      say(`Usage from ${state.shownRange}.`, "ok");
    } catch (e) {
      $("results").hidden = true;
      state.shown = null;
      say(e.message, "error");
    } finally {
      $("query").disabled = false;
    }
  }

  async function more() {
    if (!state.shown) return;
    $("more").disabled = true;
    try { await loadRecords(false); } catch (e) { say(e.message, "error"); } finally { $("more").disabled = false; }
  }

  async function exportCsv() {
    if (!$("token").value.trim()) { say("Enter a token first.", "error"); $("token").focus(); return; }
    if (oddToken()) { say(oddToken(), "error"); $("token").focus(); return; }
    const bad = readRange();
    if (bad) { say(bad, "error"); return; }
    say("Preparing the CSV…");
    try {
      const res = await call("/api/usage.csv", rangeParams());
      const { name, size } = await MG.download(res);
      say(`Exported ${name} (${num(size)} bytes).`, "ok");
    } catch (e) {
      say(e.message, "error");
    }
  }

  function switchZone() {
    // Keep the same instants: read the inputs in the old zone, show them in the new one.
    const bad = readRange();
    state.tz = $("tz").value === "UTC" ? "UTC" : BROWSER_TZ;
    showZone();
    if (!bad) setRange(state.startMs, state.endMs);
    if (!$("results").hidden) query();
  }

  document.addEventListener("DOMContentLoaded", () => {
    showZone();
    const now = Date.now();
    setRange(now - 86400000, now + 60000);
    $("query-form").addEventListener("submit", query);
    $("export").addEventListener("click", exportCsv);
    $("more").addEventListener("click", more);
    $("tz").addEventListener("change", switchZone);
    for (const b of document.querySelectorAll("[data-range]")) {
      b.addEventListener("click", () => {
        const t = Date.now();
        setRange(t - Number(b.dataset.range) * 1000, t + 60000);
        if ($("token").value.trim()) query();
      });
    }
  });
})();
