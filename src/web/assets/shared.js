// Helpers both pages share (usage page and console): time zones, formatting, a facts list, a
// chart. Loaded before each page's own script; no inline script anywhere (strict CSP).
"use strict";
window.MG = (function () {
  // The zone's offset at an instant, as +hh:mm.
  function offsetText(ms, tz) {
    const parts = new Intl.DateTimeFormat("en-US", { timeZone: tz, timeZoneName: "longOffset" })
      .formatToParts(new Date(ms));
    const name = (parts.find((p) => p.type === "timeZoneName") || {}).value || "GMT";
    const m = name.match(/GMT([+-]\d\d:\d\d)/);
    return m ? m[1] : "+00:00";
  }

  // Wall-clock fields of an instant in a zone.
  function wall(ms, tz) {
    const f = new Intl.DateTimeFormat("en-CA", {
      timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
    });
    const o = {};
    for (const p of f.formatToParts(new Date(ms))) o[p.type] = p.value;
    return o;
  }

  function inputValue(ms, tz) {
    const w = wall(ms, tz);
    return `${w.year}-${w.month}-${w.day}T${w.hour}:${w.minute}:${w.second}`;
  }

  // The zone's offset at an instant, in minutes east of UTC.
  function offsetMinutes(ms, tz) {
    const off = offsetText(ms, tz);
    const sign = off[0] === "-" ? -1 : 1;
    return sign * (parseInt(off.slice(1, 3), 10) * 60 + parseInt(off.slice(4, 6), 10));
  }

  // A datetime-local value read as wall-clock time in the zone → unix ms. Around a DST change
  // the same in every zone: a time the clocks skip is read with the offset before the change
  // (so it lands as far past the skip as it was into it), and a time that happens twice is its
  // first occurrence.
  function parseInput(value, tz) {
    if (!value) return NaN;
    const v = value.length === 16 ? value + ":00" : value;
    const asUtc = Date.parse(v + "Z");
    if (Number.isNaN(asUtc)) return NaN;
    const day = 86400000;
    const before = asUtc - offsetMinutes(asUtc - day, tz) * 60000;
    const after = asUtc - offsetMinutes(asUtc + day, tz) * 60000;
    const fits = (t) => t + offsetMinutes(t, tz) * 60000 === asUtc;
    const found = [before, after].filter(fits);
    return found.length ? Math.min(...found) : before;
  }

  // A range's end for a query made now: one in the future ends now, so the totals and the
  // record list of the query count the same requests, however long the paging takes.
  function endingNow(startMs, endMs) {
    const now = Date.now();
    return endMs > now ? Math.max(startMs + 1, now) : endMs;
  }

  function qs(params) {
    return Object.entries(params)
      .filter(([, v]) => v !== null && v !== undefined)
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`)
      .join("&");
  }

  function fact(dl, name, value) {
    const pair = document.createElement("div");
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = value;
    pair.append(dt, dd);
    dl.append(pair);
  }

  const num = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
  // Six decimals from 1 up; below 1, six significant digits, so a small cost never shows as 0.
  const credits = (n) => {
    if (n === null || n === undefined) return "—";
    const x = Number(n);
    return Math.abs(x) >= 1
      ? x.toLocaleString("en-US", { maximumFractionDigits: 6 })
      : x.toLocaleString("en-US", { maximumSignificantDigits: 6 });
  };

  // A tokens-and-cost chart of summary buckets into `box`, times in `tz`; returns the chart.
  // It follows its panel's width as the window changes.
  function chart(box, summary, tz, old) {
    if (old) {
      if (old.mgResize) old.mgResize.disconnect();
      old.destroy();
    }
    box.replaceChildren();
    if (typeof uPlot !== "function") {
      box.textContent = "The chart library did not load.";
      return null;
    }
    const b = summary.buckets;
    const width = () => Math.max(320, Math.floor(box.parentElement.getBoundingClientRect().width) - 40);
    const u = new uPlot({
      width: width(),
      height: 260,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), tz),
      scales: { x: { time: true }, cost: { auto: true } },
      series: [
        {},
        { label: "Tokens", stroke: "#2f6fdb", fill: "rgba(47,111,219,0.15)", width: 2 },
        { label: "Cost", stroke: "#d9822b", width: 2, scale: "cost", value: (u, v) => credits(v) },
      ],
      axes: [
        {},
        { label: "tokens", size: 70 },
        { label: "cost", side: 1, scale: "cost", grid: { show: false }, size: 70, values: (u, ticks) => ticks.map(credits) },
      ],
    }, [b.map((x) => x.start_ms / 1000), b.map((x) => x.total_tokens), b.map((x) => x.cost)], box);
    if (typeof ResizeObserver === "function") {
      u.mgResize = new ResizeObserver(() => {
        const w = width();
        if (w !== u.width) u.setSize({ width: w, height: 260 });
      });
      u.mgResize.observe(box.parentElement);
    }
    return u;
  }

  // The totals of a summary as a facts list.
  function totals(dl, t) {
    dl.replaceChildren();
    fact(dl, "Requests", num(t.requests));
    fact(dl, "Success rate", t.success_rate === null ? "—" : `${(t.success_rate * 100).toFixed(1)}% (${num(t.succeeded)} of ${num(t.requests)})`);
    fact(dl, "Prompt tokens", num(t.prompt_tokens));
    fact(dl, "Completion tokens", num(t.completion_tokens));
    fact(dl, "Total tokens", num(t.total_tokens));
    fact(dl, "Cost", credits(t.cost));
    fact(dl, "Latency p50", t.latency_p50_ms === null ? "—" : `${num(t.latency_p50_ms)} ms`);
    fact(dl, "Latency p95", t.latency_p95_ms === null ? "—" : `${num(t.latency_p95_ms)} ms`);
  }

  // Saves a fetched CSV under the file name the server gave; returns that name and its size.
  async function download(res) {
    const blob = await res.blob();
    const m = (res.headers.get("content-disposition") || "").match(/filename="([^"]+)"/);
    const name = m ? m[1] : "usage.csv";
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    return { name, size: blob.size };
  }

  // A row of text cells (never HTML) appended to a table body.
  function row(body, values) {
    const tr = body.insertRow();
    for (const v of values) tr.insertCell().textContent = v === null || v === undefined ? "—" : String(v);
    return tr;
  }

  return { offsetText, wall, inputValue, parseInput, endingNow, qs, fact, num, credits, chart, row, totals, download };
})();
