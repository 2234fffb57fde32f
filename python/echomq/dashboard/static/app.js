// EchoMQ dashboard: hand-written, no dependencies.
// Everything that comes from the server (ids, errors, reasons: user data) is
// put on the page as text nodes (textContent, setAttribute), never parsed as
// markup: nothing here assigns HTML, and the page's CSP allows no inline script.
"use strict";

(() => {
  const CSRF = document.querySelector('meta[name="csrf-token"]').getAttribute("content");
  const READ_ONLY = document.querySelector('meta[name="read-only"]').getAttribute("content") === "true";
  const POLL_MS = 1000;
  const SVG = "http://www.w3.org/2000/svg";
  const leaseSeen = new Map(); // job id -> the longest lease left seen: the bar's full length
  const drawn = new Map(); // section -> the JSON it was last drawn from (redraw only on change)
  let selected = new URLSearchParams(location.hash.slice(1)).get("queue");
  let timer = null;

  if (READ_ONLY) {
    document.body.classList.add("read-only");
    document.getElementById("mode").textContent = "read-only";
    for (const node of document.querySelectorAll("button.action:not(.view)")) node.remove();
  }

  // -- building the page from text -------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function duration(ms) {
    const neg = ms < 0;
    let s = Math.abs(ms) / 1000;
    let out;
    if (s < 1) out = `${Math.round(s * 1000)} ms`;
    else if (s < 60) out = `${s.toFixed(1)} s`;
    else if (s < 3600) out = `${Math.floor(s / 60)}m ${String(Math.floor(s % 60)).padStart(2, "0")}s`;
    else if (s < 86400) out = `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
    else out = `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
    return neg ? `-${out}` : out;
  }

  // Times are this browser's local time with its offset (2026-12-01 09:31:20 +0100), as the CLI
  // prints them, and an age; never raw epoch ms.
  function localTime(ms) {
    const d = new Date(ms);
    const pad = (n, w) => String(n).padStart(w || 2, "0");
    const offset = -d.getTimezoneOffset();
    const sign = offset < 0 ? "-" : "+";
    const zone = `${sign}${pad(Math.floor(Math.abs(offset) / 60))}${pad(Math.abs(offset) % 60)}`;
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())} ${zone}`;
  }

  function age(now, at) {
    return now >= at ? `${duration(now - at)} ago` : `in ${duration(at - now)}`;
  }

  function when(now, at) {
    return `${localTime(at)} (${age(now, at)})`;
  }

  // A field of a job's details as people read it: times as local time and age, spans as durations.
  function fieldText(key, value, now) {
    if (value === null || value === undefined) return "";
    if (typeof value === "number" && (key.endsWith("_at") || key === "lease_deadline")) return when(now, value);
    if (typeof value === "number" && key === "server_time") return localTime(value);
    if (typeof value === "number" && key.endsWith("_ms")) return duration(value);
    return value;
  }

  function toast(text, bad) {
    const node = document.getElementById("toast");
    node.textContent = text;
    node.className = bad ? "toast bad" : "toast";
    node.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { node.hidden = true; }, 3500);
  }

  function button(label, action, body, opts) {
    if (READ_ONLY) return null;
    return el("button", {
      class: "action" + (opts && opts.danger ? " danger" : ""),
      type: "button",
      "data-action": action,
      onclick: () => act(action, body, opts),
    }, label);
  }

  function jobLink(queue, id) {
    return el("button", { class: "linkish id", type: "button", title: "details", onclick: () => showJob(queue, id) }, id);
  }

  function changed(section, data) {
    const json = JSON.stringify(data);
    if (drawn.get(section) === json) return false;
    drawn.set(section, json);
    return true;
  }

  // -- talking to the server ---------------------------------------------------------

  async function act(action, body, opts) {
    if (opts && opts.confirm && !window.confirm(opts.confirm)) return;
    try {
      const response = await fetch(`/api/action/${action}`, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": CSRF },
        body: JSON.stringify(body),
        credentials: "same-origin",
      });
      const answer = await response.json().catch(() => ({ error: response.statusText }));
      if (!response.ok) toast(answer.error || `failed (${response.status})`, true);
      else toast(`${action}${body.id ? " " + body.id : ""}: ${answer.result}`);
    } catch (err) {
      toast(`failed: ${err}`, true);
    }
    refresh();
  }

  async function showJob(queue, id) {
    const params = new URLSearchParams({ queue, id });
    const response = await fetch(`/api/job?${params}`, { credentials: "same-origin" });
    const info = await response.json().catch(() => ({ error: response.statusText }));
    const panel = document.getElementById("job");
    const fields = document.getElementById("job-fields");
    const payload = document.getElementById("job-payload");
    document.getElementById("job-title").textContent = `job ${id}`;
    const trace = document.getElementById("job-traceback");
    const traceTitle = document.getElementById("job-traceback-title");
    fields.replaceChildren();
    payload.hidden = true;
    trace.hidden = traceTitle.hidden = true;
    if (!response.ok) {
      fields.append(el("dt", {}, "error"), el("dd", {}, info.error || response.status));
    } else {
      for (const [key, value] of Object.entries(info)) {
        if (key === "payload" || key === "payload_truncated") continue;
        if (key === "traceback") { // its own lines, as Python printed them
          if (typeof value === "string" && value) {
            trace.textContent = value;
            trace.hidden = traceTitle.hidden = false;
          }
          continue;
        }
        fields.append(el("dt", {}, key.replaceAll("_", " ")), el("dd", {}, fieldText(key, value, info.server_time)));
      }
      if (typeof info.payload === "string") {
        payload.textContent = info.payload + (info.payload_truncated ? "\n… (truncated)" : "");
        payload.hidden = false;
      }
    }
    panel.hidden = false;
  }
  document.getElementById("job-close").addEventListener("click", () => { document.getElementById("job").hidden = true; });

  if (!READ_ONLY) {
    document.getElementById("retry-all").addEventListener("click", () =>
      act("retry-dead", { queue: selected }, { confirm: `Retry every dead job of ${selected}?` }));
    document.getElementById("purge-all").addEventListener("click", () =>
      act("purge-dead", { queue: selected }, { confirm: `Delete every dead job of ${selected}? This cannot be undone.` }));
  }

  // -- drawing ---------------------------------------------------------------------------

  function drawQueues(state) {
    const body = document.querySelector("#queues tbody");
    document.getElementById("no-queues").hidden = state.queues.length > 0;
    if (!changed("queues", [state.queues, selected])) return;
    body.replaceChildren(...state.queues.map((q) => {
      const c = q.counts || {};
      const paused = !!c.paused;
      const row = el("tr", { class: "queue-row" + (q.name === selected ? " selected" : ""), "data-queue": q.name },
        el("td", { class: "id" }, q.name),
        el("td", { class: "num" }, c.pending ?? ""),
        el("td", { class: "num" }, c.delayed ?? ""),
        el("td", { class: "num" }, c.active ?? ""),
        el("td", { class: "num" }, c.lapsed ?? ""),
        el("td", { class: "num" }, c.dead ?? ""),
        el("td", { class: "num" }, q.oldest_wait_ms ? duration(q.oldest_wait_ms) : "–"),
        el("td", {}, q.error ? el("span", { class: "error-text" }, q.error)
          : el("span", { class: paused ? "pill paused" : "pill run" }, paused ? "paused" : "running")),
        el("td", { class: "act" }, paused ? button("Resume", "resume", { queue: q.name })
          : button("Pause", "pause", { queue: q.name })));
      row.addEventListener("click", (event) => {
        if (event.target.closest("button")) return;
        select(q.name);
      });
      return row;
    }));
  }

  function heading(id, shown, total, limit) {
    // The total is the sampler's (a moment older than the list): trust the list when it is not cut.
    document.getElementById(id).textContent = shown >= limit && total > shown ? `(${total}; the first ${shown} shown)` : `(${shown})`;
  }

  function drawActive(queue, jobs, total) {
    heading("active-count", jobs.length, total, lastState.selected.page_size);
    const body = document.querySelector("#active tbody");
    const live = new Set();
    body.replaceChildren(...jobs.map((j) => {
      live.add(j.id);
      // The bar's full length is the lease: on first sight, deadline - claim (exact until the first
      // extension, longer after it: the bar then errs short, never full for a nearly lapsed job);
      // then the longest time left seen since (each extension sets it back to the whole lease).
      const first = j.claimed_at ? j.lease_deadline - j.claimed_at : j.lease_left_ms;
      const longest = Math.max(leaseSeen.has(j.id) ? leaseSeen.get(j.id) : first, j.lease_left_ms);
      leaseSeen.set(j.id, longest);
      const share = j.lease_left_ms <= 0 ? 1 : Math.max(0.02, j.lease_left_ms / (longest || 1));
      const bar = el("div", { class: "bar" + (j.lease_left_ms <= 0 ? " lapsed" : share < 0.34 ? " low" : "") },
        el("span"));
      // Through the CSSOM, never a style attribute: the CSP (style-src 'self') refuses inline styles.
      bar.firstChild.style.width = `${Math.round(share * 100)}%`;
      return el("tr", { "data-job": j.id },
        el("td", {}, jobLink(queue, j.id)),
        el("td", { class: "task" }, j.task || ""),
        el("td", {}, el("div", { class: "lease" }, bar,
          el("span", { class: "left" }, j.lease_left_ms > 0 ? duration(j.lease_left_ms) : "lapsed"))),
        el("td", { class: "num" }, `${j.tries}/${j.attempts}`),
        el("td", { class: "num" }, j.stalled),
        el("td", {}, j.cancel_requested ? el("span", { class: "pill cancel" }, j.cancel_reason || "requested") : ""),
        el("td", { class: "act" }, j.cancel_requested ? null : button("Cancel", "cancel", { queue, id: j.id })));
    }));
    for (const id of leaseSeen.keys()) if (!live.has(id)) leaseSeen.delete(id);
  }

  function drawPending(queue, jobs, total) {
    heading("pending-count", jobs.length, total, lastState.selected.pending_page_size);
    if (!changed("pending", [queue, jobs.map((j) => [j.id, j.priority, j.delayed, Math.round(j.waiting_ms / 1000)])])) return;
    document.querySelector("#pending tbody").replaceChildren(...jobs.map((j) => el("tr", { "data-job": j.id },
      el("td", {}, jobLink(queue, j.id)),
      el("td", { class: "task" }, j.task || ""),
      el("td", { class: "num" }, j.priority),
      el("td", { class: "when", title: j.delayed ? localTime(j.due_at) : "" },
        j.delayed ? `due in ${duration(j.due_at - lastState.server_time)}` : duration(j.waiting_ms)),
      el("td", { class: "num" }, `${j.tries}/${j.attempts}`),
      el("td", { class: "num" }, j.retries),
      el("td", {}, j.cancel_requested ? el("span", { class: "pill cancel" }, "requested") : ""),
      el("td", { class: "act" }, button("Cancel", "cancel", { queue, id: j.id })))));
  }

  function drawDead(queue, jobs, now, total) {
    heading("dead-count", jobs.length, total, lastState.selected.page_size);
    if (!changed("dead", [queue, jobs, Math.round(now / 5000)])) return;
    document.querySelector("#dead tbody").replaceChildren(...jobs.map((j) => el("tr", { "data-job": j.id },
      el("td", {}, jobLink(queue, j.id)),
      el("td", { class: "task" }, j.task || ""),
      el("td", { class: "when", title: localTime(j.died_at) }, age(now, j.died_at)),
      el("td", { class: "num" }, `${j.tries}/${j.attempts}`),
      el("td", { class: "num" }, j.retries),
      el("td", { class: "error-text" }, j.last_error || ""),
      el("td", { class: "act" }, button("Retry", "retry", { queue, id: j.id })))));
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function drawChart(chart, windowS) {
    const box = document.getElementById("chart");
    const W = 640, H = 160, L = 34, R = 8, T = 10, B = 20;
    const span = windowS || 600; // seconds shown
    const now = chart.t.length ? chart.t[chart.t.length - 1] : Date.now();
    const series = [["throughput", "s-throughput"], ["recoveries", "s-recoveries"], ["dead_letters", "s-dead"]];
    let top = 1;
    for (const [name] of series) for (const v of chart[name]) top = Math.max(top, v);
    top = niceTop(top);
    const x = (t) => L + (W - L - R) * (1 - Math.min(span, (now - t) / 1000) / span);
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const nodes = [];
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4;
      nodes.push(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      nodes.push(svg("text", { class: "axis", x: L - 4, y: y(v) + 3, "text-anchor": "end" }, fmtRate(v)));
    }
    const ticks = span >= 600 ? [["-10m", 600], ["-5m", 300], ["-1m", 60]]
      : [[`-${Math.round(span)}s`, span], [`-${Math.round(span / 2)}s`, span / 2]];
    for (const [label, ago] of [...ticks, ["now", 0]]) {
      const anchor = ago >= span ? "start" : ago === 0 ? "end" : "middle";
      nodes.push(svg("text", { class: "axis", x: x(now - ago * 1000), y: H - 6, "text-anchor": anchor }, label));
    }
    for (const [name, cls] of series) {
      const pts = chart.t.map((t, i) => `${x(t).toFixed(1)},${y(chart[name][i]).toFixed(1)}`).join(" ");
      if (pts) nodes.push(svg("polyline", { class: cls, points: pts, "data-series": name }));
    }
    box.replaceChildren(...nodes);
  }

  function niceTop(v) { // a top that 4 gridlines divide into round numbers
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 4, 6, 8, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function fmtRate(v) {
    return Number.isInteger(v) || v >= 10 ? String(Math.round(v)) : String(Number(v.toFixed(2)));
  }

  let lastState = { server_time: 0 };

  function draw(state) {
    lastState = state;
    const banner = document.getElementById("banner");
    banner.hidden = !state.error;
    banner.textContent = state.error || "";
    const status = document.getElementById("status");
    status.textContent = state.error ? "server unreachable" : "live";
    status.className = state.error ? "status bad" : "status";
    if (state.server_time) {
      document.getElementById("clock").textContent = `server time ${localTime(state.server_time)}`;
    }
    if (!selected && state.queues.length) select(state.queues[0].name, true);
    drawQueues(state);
    const detail = document.getElementById("detail");
    const d = state.selected;
    detail.hidden = !d;
    if (!d) return;
    document.getElementById("detail-title").textContent = `queue ${d.name}`;
    drawChart(d.chart, d.window);
    const counts = (state.queues.find((q) => q.name === d.name) || {}).counts || {};
    drawActive(d.name, d.active, Math.max(d.active.length, counts.active || 0));
    drawPending(d.name, d.pending, Math.max(d.pending.length, (counts.pending || 0) + (counts.delayed || 0)));
    drawDead(d.name, d.dead, state.server_time, Math.max(d.dead.length, counts.dead || 0));
  }

  // Finished jobs have no set of their own: the page asks for them when told to (a bounded scan).
  async function showFinished() {
    const queue = selected;
    const note = document.getElementById("finished-note");
    const response = await fetch(`/api/finished?${new URLSearchParams({ queue })}`, { credentials: "same-origin" });
    const answer = await response.json().catch(() => ({ error: response.statusText }));
    const body = document.querySelector("#finished tbody");
    if (!response.ok) {
      note.textContent = answer.error || `failed (${response.status})`;
      return;
    }
    const now = lastState.server_time;
    note.textContent = answer.complete ? `(${answer.finished.length})` : `(${answer.finished.length}, from a partial scan of a large queue)`;
    body.replaceChildren(...answer.finished.map((j) => el("tr", { "data-job": j.id },
      el("td", {}, jobLink(queue, j.id)),
      el("td", { class: "task" }, j.task || ""),
      el("td", {}, j.state),
      el("td", { class: "when", title: localTime(j.finished_at) }, age(now, j.finished_at)),
      el("td", { class: "num" }, j.attempts))));
    document.getElementById("finished").hidden = false;
  }
  document.getElementById("show-finished").addEventListener("click", () => { if (selected) showFinished(); });

  function select(name, quiet) {
    selected = name;
    document.getElementById("finished").hidden = true;
    document.getElementById("finished-note").textContent = "";
    history.replaceState(null, "", `#${new URLSearchParams({ queue: name })}`);
    drawn.clear();
    if (!quiet) refresh();
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const params = selected ? `?${new URLSearchParams({ queue: selected })}` : "";
      const response = await fetch(`/api/state${params}`, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
      draw(await response.json());
    } catch (err) {
      const status = document.getElementById("status");
      status.textContent = `disconnected: ${err.message || err}`;
      status.className = "status bad";
    }
    timer = setTimeout(refresh, POLL_MS);
  }

  refresh();
})();
