// The console (main listener, GET /): sign-in, keys, usage across keys, models, audit log.
// Vanilla JS, no inline script (strict CSP); everything from the server is set as text.
// State-changing calls carry the session's CSRF token; the session cookie is HttpOnly.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const { wall, inputValue, parseInput, qs, fact, num, credits, row } = window.MG;
  // The endpoint groups this gateway knows, from the session info.
  let GROUPS = [];
  const FIELDS = ["time", "request_id", "key_id", "listener", "endpoint", "model", "status", "stream",
    "prompt_tokens", "completion_tokens", "total_tokens", "cost", "latency_ms", "ttft_ms", "upstream", "estimated", "attempts", "served_model"];
  const TZ = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  const state = { csrf: "", keys: [], editing: null, loaded: null, cursor: null, chart: null, range: null };

  function say(text, kind, el) {
    const s = el || $("status");
    s.textContent = text;
    s.className = "status" + (kind ? " " + kind : "");
  }

  // A console API call. Throws an Error meant for a person; a lost session shows the sign-in.
  async function call(method, path, body) {
    const headers = { "x-csrf-token": state.csrf };
    if (body !== undefined) headers["content-type"] = "application/json";
    let res;
    try {
      res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store", credentials: "same-origin" });
    } catch (e) {
      throw new Error(`The request failed before the gateway answered (${e.message}).`);
    }
    if (res.ok) return res;
    let detail = "", code = "";
    try { const b = await res.json(); detail = (b.error && b.error.message) || ""; code = (b.error && b.error.code) || ""; } catch (_) { /* empty */ }
    // A read without a session is 401; a change without one is 403 `not_signed_in`.
    const signedOut = res.status === 401 || code === "not_signed_in";
    if (signedOut && path !== "/console/login") { showLogin("Your session has ended: sign in again."); }
    throw new Error(`${res.status}: ${detail || res.statusText}`);
  }

  function showLogin(message) {
    // A new secret is shown once, to whoever made it: never to the next one to sign in here.
    hideSecret();
    $("app").hidden = true;
    $("who").hidden = true;
    $("login").hidden = false;
    say(message || "", message ? "error" : "", $("login-status"));
    $("user").focus();
  }

  async function showApp() {
    const res = await call("GET", "/console/api/session");
    const s = await res.json();
    state.csrf = s.csrf;
    if (!GROUPS.length) {
      GROUPS = s.endpoint_groups;
      const eps = $("k-endpoints");
      for (const g of GROUPS) {
        const label = document.createElement("label");
        label.className = "check";
        const box = document.createElement("input");
        box.type = "checkbox";
        box.id = `k-ep-${g}`;
        box.checked = true;
        label.append(box, document.createTextNode(` ${g}`));
        eps.append(label);
      }
    }
    $("who").textContent = `Signed in as ${s.user} until ${s.expires_at}.`;
    $("who").hidden = false;
    $("login").hidden = true;
    $("app").hidden = false;
    await loadKeys();
  }

  async function signIn(ev) {
    ev.preventDefault();
    say("Signing in…", "", $("login-status"));
    try {
      await call("POST", "/console/login", { user: $("user").value, password: $("password").value });
      $("password").value = "";
      await showApp();
      say("", "", $("login-status"));
    } catch (e) {
      say(e.message.startsWith("401") ? "Wrong user or password." : e.message, "error", $("login-status"));
    }
  }

  async function signOut() {
    try {
      await call("POST", "/console/logout");
    } catch (e) {
      // A session already ended shows the sign-in (`call`); any other failure leaves the
      // session in force, and saying "Signed out" would be untrue.
      if (!$("app").hidden) {
        say(`Not signed out: ${e.message} You are still signed in.`, "error");
        return;
      }
    }
    state.csrf = "";
    showLogin("Signed out.");
  }

  // ---- Keys -------------------------------------------------------------------------------
  function when(iso, tz = TZ) {
    if (!iso) return null;
    const w = wall(Date.parse(iso), tz);
    return `${w.year}-${w.month}-${w.day} ${w.hour}:${w.minute}`;
  }

  async function loadKeys() {
    const res = await call("GET", "/console/api/keys");
    state.keys = (await res.json()).data;
    const body = $("keys").tBodies[0];
    body.replaceChildren();
    const pick = $("u-key");
    const chosen = pick.value;
    pick.replaceChildren(new Option("All keys", ""));
    for (const k of state.keys) {
      pick.append(new Option(k.id, k.id));
      const tr = row(body, [k.id, k.hint || "(hash only)", (k.models || []).join(", "), k.endpoints.join(", "),
        k.rpm, k.tpm, k.max_concurrent, k.budget === null ? "none" : credits(k.budget), credits(k.spend),
        when(k.last_used) || "never",
        // In UTC, as the form takes it.
        k.expires_at ? `${when(k.expires_at, "UTC")} UTC` : "never", k.disabled ? "disabled" : "active"]);
      tr.dataset.key = k.id;
      const cell = tr.insertCell();
      cell.className = "actions-cell";
      for (const [label, fn] of [["Edit", editKey], [k.disabled ? "Enable" : "Disable", toggleKey], ["Rotate", rotateKey], ["Delete", deleteKey]]) {
        const b = document.createElement("button");
        b.type = "button";
        b.textContent = label;
        b.setAttribute("aria-label", `${label} ${k.id}`);
        b.addEventListener("click", () => fn(k));
        cell.append(b);
      }
    }
    pick.value = chosen;
  }

  function formFields() {
    const numOrNull = (id) => ($(id).value === "" ? null : Number($(id).value));
    const models = $("k-models").value.split(",").map((m) => m.trim()).filter(Boolean);
    const endpoints = GROUPS.filter((g) => $(`k-ep-${g}`).checked);
    const exp = $("k-expires").value;
    return {
      models: models.length ? models : ["*"],
      endpoints,
      rpm: numOrNull("k-rpm"),
      tpm: numOrNull("k-tpm"),
      max_concurrent: numOrNull("k-conc"),
      budget: numOrNull("k-budget"),
      expires_at: exp ? new Date(parseInput(exp, "UTC")).toISOString().replace(".000Z", "Z") : null,
    };
  }

  function resetForm() {
    state.editing = null;
    state.loaded = null;
    $("key-form").reset();
    for (const g of GROUPS) $(`k-ep-${g}`).checked = true;
    $("k-id").disabled = false;
    $("key-form-title").textContent = "New key";
    $("k-save").textContent = "Create key";
    $("k-cancel").hidden = true;
  }

  function editKey(k) {
    resetForm();
    state.editing = k.id;
    $("k-id").value = k.id;
    $("k-id").disabled = true;
    $("k-models").value = (k.models || []).join(", ");
    for (const g of GROUPS) $(`k-ep-${g}`).checked = k.endpoints.includes(g);
    $("k-rpm").value = k.rpm ?? "";
    $("k-tpm").value = k.tpm ?? "";
    $("k-conc").value = k.max_concurrent ?? "";
    $("k-budget").value = k.budget ?? "";
    $("k-expires").value = k.expires_at ? inputValue(Date.parse(k.expires_at), "UTC") : "";
    // What the form showed when it opened: a save sends only what differs from it, so a
    // change someone else made meanwhile to another field stays.
    state.loaded = formFields();
    $("key-form-title").textContent = `Edit key ${k.id}`;
    $("k-save").textContent = "Save changes";
    $("k-cancel").hidden = false;
    $("k-id").scrollIntoView({ block: "center" });
  }

  function showSecret(secret) {
    $("secret").textContent = secret;
    $("secret-box").hidden = false;
  }

  function hideSecret() {
    $("secret").textContent = "";
    $("secret-box").hidden = true;
  }

  async function saveKey(ev) {
    ev.preventDefault();
    hideSecret();
    const fields = formFields();
    try {
      if (state.editing) {
        const changed = Object.fromEntries(Object.entries(fields)
          .filter(([name, v]) => JSON.stringify(v) !== JSON.stringify(state.loaded[name])));
        if (Object.keys(changed).length === 0) {
          say(`Nothing changed in key ${state.editing}.`);
          return;
        }
        await call("PATCH", `/console/api/keys/${encodeURIComponent(state.editing)}`, changed);
        say(`Key ${state.editing} saved.`, "ok");
      } else {
        const id = $("k-id").value.trim();
        const created = await (await call("POST", "/console/api/keys", { id, ...fields })).json();
        showSecret(created.secret);
        say(`Key ${id} created.`, "ok");
      }
      resetForm();
      await loadKeys();
    } catch (e) {
      say(e.message, "error");
    }
  }

  async function toggleKey(k) {
    try {
      await call("PATCH", `/console/api/keys/${encodeURIComponent(k.id)}`, { disabled: !k.disabled });
      say(`Key ${k.id} ${k.disabled ? "enabled" : "disabled"}.`, "ok");
      await loadKeys();
    } catch (e) { say(e.message, "error"); }
  }

  async function rotateKey(k) {
    if (!window.confirm(`Give ${k.id} a new secret? The old one stops working at once.`)) return;
    try {
      const r = await (await call("POST", `/console/api/keys/${encodeURIComponent(k.id)}/rotate`)).json();
      showSecret(r.secret);
      say(`Key ${k.id} has a new secret.`, "ok");
      await loadKeys();
    } catch (e) { say(e.message, "error"); }
  }

  async function deleteKey(k) {
    if (!window.confirm(`Delete ${k.id}? Its records stay; the key stops working at once.`)) return;
    try {
      await call("DELETE", `/console/api/keys/${encodeURIComponent(k.id)}`);
      // The form no longer edits a key that is gone.
      if (state.editing === k.id) resetForm();
      say(`Key ${k.id} deleted.`, "ok");
      await loadKeys();
    } catch (e) { say(e.message, "error"); }
  }

  async function copySecret() {
    const text = $("secret").textContent;
    try {
      await navigator.clipboard.writeText(text);
      say("Secret copied.", "ok");
    } catch (_) {
      const r = document.createRange();
      r.selectNodeContents($("secret"));
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(r);
      say("Press Ctrl+C to copy the selected secret.");
    }
  }

  // ---- Usage ------------------------------------------------------------------------------
  function usageParams() {
    const s = parseInput($("u-from").value, TZ), e = parseInput($("u-to").value, TZ);
    if (Number.isNaN(s) || Number.isNaN(e) || s >= e) throw new Error("Enter a From before the To.");
    const p = { start: new Date(s).toISOString(), end: new Date(e).toISOString() };
    if ($("u-key").value) p.key_id = $("u-key").value;
    if ($("u-model").value.trim()) p.model = $("u-model").value.trim();
    return p;
  }

  function sumsRow(body, name, s) {
    row(body, [name, num(s.requests), num(s.succeeded), num(s.total_tokens), credits(s.cost)]);
  }

  async function queryUsage(ev) {
    if (ev) ev.preventDefault();
    try {
      const p = usageParams();
      p.end = new Date(MG.endingNow(Date.parse(p.start), Date.parse(p.end))).toISOString();
      state.range = p;
      say("Loading…");
      const [sum, days] = await Promise.all([
        call("GET", `/console/api/usage/summary?${qs({ ...p, tz: TZ })}`).then((r) => r.json()),
        call("GET", `/console/api/usage/summary?${qs({ ...p, tz: TZ, bucket: "day" })}`).then((r) => r.json()),
      ]);
      if (sum.totals.requests === 0) {
        $("usage-results").hidden = true;
        $("usage-empty").hidden = false;
        $("usage-empty").textContent = "No usage records match this key, model and range.";
        say("");
        return;
      }
      $("usage-empty").hidden = true;
      $("usage-results").hidden = false;
      MG.totals($("u-totals"), sum.totals);
      state.chart = MG.chart($("u-chart"), sum, TZ, state.chart);
      const daily = days.buckets.filter((d) => d.requests).map((d) => ({ ...d, day: d.start.slice(0, 10) }));
      for (const [id, list, name] of [["u-by-key", sum.keys, "key_id"], ["u-by-model", sum.models, "model"], ["u-by-day", daily, "day"]]) {
        const table = $(id);
        table.tBodies[0].replaceChildren();
        for (const s of list) sumsRow(table.tBodies[0], s[name] || "(none)", s);
        // Each group-by table ends with the range's totals.
        const foot = table.tFoot || table.createTFoot();
        foot.replaceChildren();
        sumsRow(foot, "Total", sum.totals);
      }
      state.cursor = null;
      $("u-records").tBodies[0].replaceChildren();
      await moreRecords();
      say(`Usage of ${p.key_id || "all keys"} loaded.`, "ok");
    } catch (e) {
      // No results of an earlier query stay under a refused one.
      $("usage-results").hidden = true;
      $("usage-empty").hidden = true;
      say(e.message, "error");
    }
  }

  async function moreRecords() {
    const p = { ...state.range, order: "desc", limit: 50 };
    if (state.cursor) p.cursor = state.cursor;
    const page = await (await call("GET", `/console/api/usage?${qs(p)}`)).json();
    const body = $("u-records").tBodies[0];
    for (const r of page.data) {
      row(body, FIELDS.map((f) => (f === "time" ? when(r.time) + r.time.slice(16, 19) : typeof r[f] === "boolean" ? (r[f] ? "yes" : "no") : r[f])));
    }
    state.cursor = page.has_more ? page.next_cursor : null;
    $("u-more").hidden = !page.has_more;
  }

  async function exportUsage() {
    try {
      const p = usageParams();
      const res = await call("GET", `/console/api/usage.csv?${qs(p)}`);
      const { name } = await MG.download(res);
      say(`Exported ${name}.`, "ok");
    } catch (e) { say(e.message, "error"); }
  }

  // ---- Models and audit -------------------------------------------------------------------
  async function loadModels() {
    const m = await (await call("GET", "/console/api/models")).json();
    const mb = $("models").tBodies[0], pb = $("pools").tBodies[0];
    mb.replaceChildren();
    pb.replaceChildren();
    for (const x of m.models) row(mb, [x.name, x.pool, x.upstream_model, x.price.prompt, x.price.completion, x.price.request]);
    for (const p of m.pools) row(pb, [p.name, p.upstreams.join(", "), p.has_api_key ? "set" : "none", `${p.connect_timeout_ms} ms`, `${p.read_timeout_ms} ms`]);
  }

  async function loadAudit() {
    const a = await (await call("GET", "/console/api/audit?limit=500")).json();
    const body = $("audit").tBodies[0];
    body.replaceChildren();
    for (const e of a.data) row(body, [e.time.replace("T", " ").slice(0, 19), e.user, e.action, e.key_id, JSON.stringify(e.detail)]);
  }

  async function showTab(name) {
    hideSecret();
    for (const b of document.querySelectorAll("[data-tab]")) {
      b.classList.toggle("active", b.dataset.tab === name);
      // Which section is shown, for a screen reader as for the eye.
      if (b.dataset.tab === name) b.setAttribute("aria-current", "true");
      else b.removeAttribute("aria-current");
    }
    for (const t of ["keys", "usage", "models", "audit"]) $(`tab-${t}`).hidden = t !== name;
    say("");
    try {
      if (name === "keys") await loadKeys();
      if (name === "models") await loadModels();
      if (name === "audit") await loadAudit();
    } catch (e) { say(e.message, "error"); }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const now = Date.now();
    $("u-from").value = inputValue(now - 7 * 86400000, TZ);
    $("u-to").value = inputValue(now + 60000, TZ);
    $("u-tz").textContent = TZ;
    $("login").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", signOut);
    $("key-form").addEventListener("submit", saveKey);
    $("k-cancel").addEventListener("click", resetForm);
    $("copy-secret").addEventListener("click", copySecret);
    $("usage-form").addEventListener("submit", queryUsage);
    $("u-export").addEventListener("click", exportUsage);
    $("u-more").addEventListener("click", () => moreRecords().catch((e) => say(e.message, "error")));
    for (const b of document.querySelectorAll("[data-tab]")) b.addEventListener("click", () => showTab(b.dataset.tab));
    showApp().catch(() => showLogin());
  });
})();
