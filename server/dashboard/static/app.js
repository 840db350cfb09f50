/* FedEnt dashboard page: fetches /api/*, draws small canvas charts and follows /api/events (SSE).
 * The server embeds the run's state in the page (#initial-data, the API's own JSON), so the first paint
 * is drawn from it before any fetch; fetches and events then keep it current. Hand-written, no dependencies. Each chart exposes what it drew as data-* attributes (data-points,
 * data-series, data-last) so tests and scripts can read the page without parsing pixels. */
"use strict";

(() => {
  const PHASES = ["starting", "estimating", "training", "aggregating", "evaluating", "done"];
  const PALETTE = ["#2f6fde", "#e4572e", "#17a398", "#f3a712", "#8e44ad", "#c0392b", "#3d9970", "#ff6f91",
    "#4b6584", "#a0522d", "#0fb9b1", "#6c5ce7"];
  const HEAT_STOPS = [[243, 246, 252], [158, 192, 245], [47, 111, 222], [23, 48, 107]];

  const $ = (sel) => document.querySelector(sel);
  const token = readToken(); // kept out of `state`, which is exposed below
  const state = {
    status: null, statusAt: 0, rounds: [], clients: null, estimator: null, partition: null,
    refreshing: false, pending: null, pendingWanted: false, refreshes: 0, source: null, initial: false,
  };
  window.fedentDashboard = state; // for debugging in the console

  // ---- token: ?token= once, then kept in sessionStorage and removed from the address bar ----------
  function readToken() {
    const params = new URLSearchParams(window.location.search);
    let tok = params.get("token");
    try {
      if (tok) sessionStorage.setItem("fedent-token", tok);
      else tok = sessionStorage.getItem("fedent-token");
    } catch (e) { /* storage disabled: keep the token in memory only */ }
    if (params.has("token")) {
      params.delete("token");
      const q = params.toString();
      window.history.replaceState(null, "", window.location.pathname + (q ? "?" + q : "") + window.location.hash);
    }
    return tok || null;
  }

  class AuthError extends Error {}

  async function getJSON(path) {
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const r = await fetch(path, { headers, cache: "no-store" });
    if (r.status === 401) throw new AuthError("unauthorized");
    if (!r.ok) throw new Error(path.split("?")[0] + ": HTTP " + r.status);
    return r.json();
  }

  // ---- formatting ------------------------------------------------------------------------------------
  function fmtNum(v, digits = 4) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return Number(v.toPrecision(digits)).toString();
  }
  /** A tick label with just enough decimals to tell neighbouring ticks ``step`` apart. */
  function fmtTick(v, step, percent) {
    const scale = percent ? 100 : 1;
    const a = Math.abs(v * scale), st = step * scale;
    if (a !== 0 && (a >= 1e6 || (a < 1e-3 && st < 1e-4))) return v.toExponential(1);
    const dec = Math.min(10, Math.max(0, Math.ceil(-Math.log10(st) + 1e-9)));
    return (v * scale).toFixed(dec) + (percent ? "%" : "");
  }
  function fmtPct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%"; }
  function fmtDuration(s) {
    if (s === null || s === undefined || !Number.isFinite(s)) return "–";
    s = Math.max(0, s);
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
    return h > 0 ? `${h} h ${String(m).padStart(2, "0")} m` : `${m} m ${String(sec).padStart(2, "0")} s`;
  }
  function fmtBytes(b) {
    if (b === null || b === undefined) return "–";
    const units = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (b >= 1000 && i < units.length - 1) { b /= 1000; i++; }
    return (i === 0 ? b : b.toFixed(b < 10 ? 2 : 1)) + " " + units[i];
  }
  function fmtAge(s) {
    if (s === null || s === undefined) return "–";
    return s < 1 ? "now" : fmtDuration(s) + " ago";
  }

  // ---- data loading ------------------------------------------------------------------------------------
  /** The state the server rendered into the page (absent when the dashboard needs a token). */
  function loadInitial() {
    const el = document.getElementById("initial-data");
    const raw = el ? el.textContent.trim() : "";
    if (!raw) return false;
    let d;
    try { d = JSON.parse(raw); } catch (e) { return false; }
    if (!d || !d.status || !d.rounds) return false;
    state.status = d.status;
    state.statusAt = Date.now();
    state.rounds = d.rounds.items || [];
    state.clients = d.clients || null;
    state.estimator = d.estimator || null;
    state.partition = d.partition || null;
    state.initial = true;
    return true;
  }

  async function loadRounds() {
    let offset = state.rounds.length;
    for (let guard = 0; guard < 10000; guard++) {
      const page = await getJSON(`api/rounds?offset=${offset}&limit=1000`);
      if (page.total < state.rounds.length) { // the log was replaced: start over
        state.rounds = [];
        offset = 0;
        continue;
      }
      state.rounds.push(...page.items);
      offset += page.items.length;
      if (page.items.length === 0 || offset >= page.total) return;
    }
  }

  /** Re-read what changed (files named by the SSE event) or everything (files = null). */
  async function refresh(files) {
    if (state.refreshing) { // coalesce bursts of events into one follow-up refresh
      if (!state.pendingWanted) { state.pending = files; state.pendingWanted = true; }
      else if (state.pending !== null) state.pending = files === null ? null : state.pending.concat(files);
      return;
    }
    state.refreshing = true;
    const want = (...names) => files === null || names.some((n) => files.includes(n));
    try {
      const jobs = [getJSON("api/status").then((s) => { state.status = s; state.statusAt = Date.now(); })];
      if (want("metrics.jsonl")) jobs.push(loadRounds());
      if (want("clients.json", "metrics.jsonl", "partition.json", "status.json")) {
        jobs.push(getJSON("api/clients").then((c) => { state.clients = c; }));
      }
      if (want("estimator.json", "metrics.jsonl")) jobs.push(getJSON("api/estimator").then((e) => { state.estimator = e; }));
      if (want("partition.json") || state.partition === null) {
        jobs.push(getJSON("api/partition").then((p) => { state.partition = p; }));
      }
      await Promise.all(jobs);
      state.refreshes++;
      hideError();
      render();
    } catch (e) {
      if (e instanceof AuthError) {
        setLive("unauthorized");
        showError("Unauthorized: this dashboard needs a token. Open the page as /?token=YOUR_TOKEN.");
      } else {
        showError("Could not load data: " + e.message);
      }
    } finally {
      state.refreshing = false;
      if (state.pendingWanted) {
        const next = state.pending;
        state.pending = null;
        state.pendingWanted = false;
        refresh(next);
      }
    }
  }

  function showError(msg) { const el = $("#error"); el.textContent = msg; el.hidden = false; }
  function hideError() { $("#error").hidden = true; }
  function setLive(s) { const el = $("#live"); el.dataset.state = s; el.textContent = s; }

  // ---- live updates ----------------------------------------------------------------------------------
  function connect() {
    if (typeof EventSource === "undefined") { setLive("polling"); setInterval(() => refresh(null), 5000); return; }
    const url = "api/events" + (token ? "?token=" + encodeURIComponent(token) : "");
    const es = new EventSource(url);
    state.source = es;
    es.addEventListener("hello", () => { setLive("live"); refresh(null); });
    es.addEventListener("change", (ev) => {
      let files = null;
      try { files = JSON.parse(ev.data).files || null; } catch (e) { files = null; }
      refresh(files);
    });
    es.addEventListener("error", () => {
      if (es.readyState === EventSource.CLOSED) { // e.g. 401 or server gone: retry slowly ourselves
        setLive("reconnecting");
        setTimeout(connect, 3000);
      } else {
        setLive("reconnecting");
      }
    });
  }

  // ---- rendering -----------------------------------------------------------------------------------------
  function render() {
    renderStatus();
    renderCharts();
    renderHeatmap();
    renderClients();
    renderEstimator();
    $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
  }

  function renderStatus() {
    const s = state.status;
    if (!s) return;
    $("#run-id").textContent = s.run_id;
    $("#algorithm").textContent = s.algorithm || "–";
    $("#evaluation").textContent = s.evaluation || "–";
    $("#placement").textContent = s.data_placement || "–";
    $("#round").textContent = String(s.rounds_completed);
    $("#rounds").textContent = s.rounds === null ? "?" : String(s.rounds);
    const ph = $("#phase");
    ph.textContent = s.phase;
    ph.dataset.phase = s.phase;
    tickClock();
    const accs = state.rounds.filter((r) => r.test_acc !== null);
    $("#last-acc").textContent = accs.length ? fmtPct(accs[accs.length - 1].test_acc) : "–";

    const prog = $(".progress");
    prog.dataset.phase = s.phase;
    const pct = Math.round(1000 * s.progress) / 10;
    $("#progress-fill").style.width = pct + "%";
    $("#progress").setAttribute("aria-valuenow", String(pct));
    const cur = PHASES.indexOf(s.phase);
    for (const li of document.querySelectorAll("#phases li")) {
      const i = PHASES.indexOf(li.dataset.phase);
      li.classList.toggle("current", i === cur);
      li.classList.toggle("past", cur >= 0 && i < cur);
    }
    const inFlight = s.round !== null && s.round >= s.rounds_completed && s.phase !== "done" && s.phase !== "failed";
    const working = inFlight ? ` · round ${s.round} ${s.phase}` : "";
    $("#progress-text").textContent = `${s.rounds_completed} / ${s.rounds ?? "?"} rounds · ${pct}%${working}`;
    if (s.phase === "failed") showError("Run failed" + (s.error ? ": " + s.error : "."));
  }

  function tickClock() {
    const s = state.status;
    if (!s) return;
    const active = s.phase !== "done" && s.phase !== "failed" && s.phase !== "unknown";
    const extra = active ? (Date.now() - state.statusAt) / 1000 : 0;
    $("#elapsed").textContent = fmtDuration(s.elapsed_s === null ? null : s.elapsed_s + extra);
    $("#eta").textContent = s.phase === "done" ? "done" : fmtDuration(s.eta_s === null ? null : Math.max(0, s.eta_s - extra));
  }

  function pointsOf(rows, get) {
    const out = [];
    for (const r of rows) {
      const y = get(r);
      if (y !== null && y !== undefined && Number.isFinite(y)) out.push([r.round, y]);
    }
    return out;
  }

  function renderCharts() {
    const rounds = state.rounds;
    drawLineChart($("#chart-accuracy"), [
      { name: "test accuracy", color: PALETTE[0], points: pointsOf(rounds, (r) => r.test_acc) },
    ], { yMin: 0, yMax: 1, percent: true, format: fmtPct, empty: "no evaluation yet" });
    drawLineChart($("#chart-loss"), [
      { name: "test loss", color: PALETTE[1], points: pointsOf(rounds, (r) => r.test_loss) },
      { name: "train loss", color: PALETTE[2], dashed: true, points: pointsOf(rounds, (r) => r.train_loss) },
    ], { empty: "no losses yet" });

    const traj = state.estimator ? state.estimator.trajectory : [];
    drawLineChart($("#chart-phi2"), [
      { name: "predicted φ2", color: PALETTE[4], dashed: true, points: pointsOf(traj, (p) => p.phi2_pred) },
      { name: "actual φ2", color: PALETTE[0], points: pointsOf(traj, (p) => p.phi2_actual) },
    ], { empty: "no estimator data (FedEnt runs only)" });
    drawLineChart($("#chart-entropy"), [
      { name: "entropy", color: PALETTE[2], points: pointsOf(traj, (p) => p.entropy) },
    ], { empty: "no entropy data (FedEnt runs only)" });

    const perClient = new Map();
    for (const r of rounds) {
      if (!r.fedent) continue;
      for (const d of r.fedent.clients) {
        if (d.eta === null || !Number.isFinite(d.eta)) continue;
        if (!perClient.has(d.client)) perClient.set(d.client, []);
        perClient.get(d.client).push([r.round, d.eta]);
      }
    }
    const etaSeries = [...perClient.keys()].sort((a, b) => a - b).map((cid) => ({
      name: "client " + cid, color: PALETTE[cid % PALETTE.length], points: perClient.get(cid),
    }));
    drawLineChart($("#chart-eta"), etaSeries, { empty: "no per-client η (FedEnt runs only)", autoLog: true,
      legendLimit: 10 });
  }

  // ---- line chart ------------------------------------------------------------------------------------------
  function niceStep(span, count) {
    const raw = span / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const n = raw / mag;
    return (n < 1.5 ? 1 : n < 3 ? 2 : n < 7 ? 5 : 10) * mag;
  }
  function ticks(lo, hi, count) {
    const step = niceStep(hi - lo || 1, count);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }

  function setupCanvas(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(50, canvas.clientWidth), h = Math.max(50, canvas.clientHeight);
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    return { ctx, w, h };
  }

  function drawLineChart(fig, series, opts, hoverX = null) {
    fig._chart = { series, opts };
    const canvas = fig.querySelector("canvas");
    const { ctx, w, h } = setupCanvas(canvas);
    const filled = series.filter((s) => s.points.length > 0);
    const total = filled.reduce((n, s) => n + s.points.length, 0);
    fig.dataset.points = String(total);
    fig.dataset.series = String(filled.length);
    const first = filled[0];
    fig.dataset.last = first ? String(first.points[first.points.length - 1][1]) : "";
    renderLegend(fig, filled, opts);
    if (total === 0) {
      ctx.fillStyle = "#8a93a6";
      ctx.textAlign = "center";
      ctx.fillText(opts.empty || "no data yet", w / 2, h / 2);
      fig._geom = null;
      return;
    }
    const all = filled.flatMap((s) => s.points);
    let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    const ys = all.map((p) => p[1]);
    const log = opts.autoLog && Math.min(...ys) > 0 && Math.max(...ys) / Math.min(...ys) > 100;
    const tf = log ? Math.log10 : (v) => v;
    let y0 = Math.min(...ys.map(tf)), y1 = Math.max(...ys.map(tf));
    const pad = (y1 - y0) * 0.08 || Math.abs(y1) * 0.1 || 0.5;
    y0 -= pad; y1 += pad;
    if (!log && opts.yMin !== undefined) y0 = Math.max(y0, opts.yMin);
    if (!log && opts.yMax !== undefined) y1 = Math.min(y1, opts.yMax);
    if (y1 <= y0) y1 = y0 + 1;
    const yt = log ? ticks(Math.ceil(y0), Math.floor(y1), 4).filter((v) => Number.isInteger(v)) : ticks(y0, y1, 4);
    const step = yt.length > 1 ? yt[1] - yt[0] : Math.abs(y1 - y0) || 1;
    const fmtY = log ? (v) => fmtNum(Math.pow(10, v), 2) : (v) => fmtTick(v, step, opts.percent);
    const left = 8 + Math.max(...yt.map((v) => ctx.measureText(fmtY(v)).width), 10);
    const m = { l: left, r: 10, t: 8, b: 20 };
    const px = (x) => m.l + ((x - x0) / (x1 - x0)) * (w - m.l - m.r);
    const py = (y) => h - m.b - ((tf(y) - y0) / (y1 - y0)) * (h - m.t - m.b);
    const pyT = (t) => h - m.b - ((t - y0) / (y1 - y0)) * (h - m.t - m.b);

    ctx.strokeStyle = "#e6e9f0";
    ctx.fillStyle = "#7a8397";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const t of yt) {
      const y = Math.round(pyT(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(m.l, y); ctx.lineTo(w - m.r, y); ctx.stroke();
      ctx.fillText(fmtY(t), m.l - 5, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const xt = ticks(x0, x1, Math.max(2, Math.floor((w - m.l) / 60))).filter((v) => Number.isInteger(v));
    for (const t of xt) ctx.fillText(String(t), px(t), h - m.b + 5);
    ctx.strokeStyle = "#c5cbd8";
    ctx.beginPath(); ctx.moveTo(m.l, h - m.b + 0.5); ctx.lineTo(w - m.r, h - m.b + 0.5); ctx.stroke();

    if (hoverX !== null) {
      ctx.strokeStyle = "#b8c0d0";
      ctx.setLineDash([3, 3]);
      ctx.beginPath(); ctx.moveTo(px(hoverX), m.t); ctx.lineTo(px(hoverX), h - m.b); ctx.stroke();
      ctx.setLineDash([]);
    }
    const many = filled.length > 12;
    for (const s of filled) {
      ctx.strokeStyle = s.color;
      ctx.fillStyle = s.color;
      ctx.lineWidth = many ? 1 : 1.8;
      ctx.globalAlpha = many ? 0.7 : 1;
      ctx.setLineDash(s.dashed ? [5, 4] : []);
      ctx.beginPath();
      s.points.forEach(([x, y], i) => (i === 0 ? ctx.moveTo(px(x), py(y)) : ctx.lineTo(px(x), py(y))));
      ctx.stroke();
      ctx.setLineDash([]);
      if (s.points.length <= 40 || s.points.length === 1) {
        for (const [x, y] of s.points) { ctx.beginPath(); ctx.arc(px(x), py(y), many ? 1.6 : 2.4, 0, 2 * Math.PI); ctx.fill(); }
      }
      ctx.globalAlpha = 1;
    }
    fig._geom = { x0, x1, m, w, px };
  }

  function renderLegend(fig, filled, opts) {
    const el = fig.querySelector(".legend");
    const limit = opts.legendLimit || 8;
    const items = [];
    for (const s of filled.slice(0, limit)) {
      const span = document.createElement("span");
      const sw = document.createElement("i");
      sw.className = "sw" + (s.dashed ? " dashed" : "");
      sw.style.background = s.color;
      sw.style.borderColor = s.color;
      span.append(sw, document.createTextNode(s.name));
      items.push(span);
    }
    if (filled.length > limit) {
      const more = document.createElement("span");
      more.textContent = `+${filled.length - limit} more`;
      items.push(more);
    }
    el.replaceChildren(...items);
  }

  function attachHover(fig) {
    const canvas = fig.querySelector("canvas");
    const tip = fig.querySelector(".tip");
    canvas.addEventListener("mousemove", (ev) => {
      const g = fig._geom, c = fig._chart;
      if (!g || !c) return;
      const rect = canvas.getBoundingClientRect();
      const frac = (ev.clientX - rect.left - g.m.l) / (g.w - g.m.l - g.m.r);
      const x = Math.round(g.x0 + frac * (g.x1 - g.x0));
      const lines = [`round ${x}`];
      const fmt = c.opts.format || ((v) => fmtNum(v, 4));
      let shown = 0;
      for (const s of c.series) {
        const p = s.points.find((q) => q[0] === x);
        if (!p) continue;
        if (shown++ >= 10) { lines.push("…"); break; }
        lines.push(`${s.name}: ${fmt(p[1])}`);
      }
      if (lines.length === 1) { tip.hidden = true; return; }
      tip.textContent = lines.join("\n");
      tip.hidden = false;
      const left = g.px(x) + 12;
      tip.style.left = (left + tip.offsetWidth > g.w ? g.px(x) - tip.offsetWidth - 12 : left) + "px";
      drawLineChart(fig, c.series, c.opts, x);
    });
    canvas.addEventListener("mouseleave", () => {
      tip.hidden = true;
      if (fig._chart) drawLineChart(fig, fig._chart.series, fig._chart.opts);
    });
  }

  // ---- partition heatmap -----------------------------------------------------------------------------------
  function heatColor(t) {
    t = Math.min(1, Math.max(0, t)) * (HEAT_STOPS.length - 1);
    const i = Math.min(HEAT_STOPS.length - 2, Math.floor(t)), f = t - i;
    const a = HEAT_STOPS[i], b = HEAT_STOPS[i + 1];
    return `rgb(${a.map((v, k) => Math.round(v + f * (b[k] - v))).join(",")})`;
  }

  function renderHeatmap() {
    const fig = $("#heatmap");
    const p = state.partition;
    const canvas = fig.querySelector("canvas");
    const { ctx, w, h } = setupCanvas(canvas);
    const counts = p && p.available ? p.label_counts : [];
    const n = counts.length, c = n ? counts[0].length : 0;
    fig.dataset.points = String(n * c);
    fig.dataset.clients = String(n);
    fig.dataset.classes = String(c);
    if (!n || !c) {
      ctx.fillStyle = "#8a93a6";
      ctx.textAlign = "center";
      ctx.fillText("no partition.json yet", w / 2, h / 2);
      fig._heat = null;
      return;
    }
    $("#partition-meta").textContent = `${p.scheme || "?"} · ${n} clients × ${c} classes`;
    const m = { l: 26, r: 6, t: 4, b: 18 };
    const cw = (w - m.l - m.r) / n, ch = (h - m.t - m.b) / c;
    let maxShare = 0;
    const shares = counts.map((row) => {
      const tot = row.reduce((a, b) => a + b, 0) || 1;
      return row.map((v) => { const s = v / tot; maxShare = Math.max(maxShare, s); return s; });
    });
    for (let i = 0; i < n; i++) {
      for (let k = 0; k < c; k++) {
        ctx.fillStyle = heatColor(maxShare ? shares[i][k] / maxShare : 0);
        ctx.fillRect(m.l + i * cw, m.t + k * ch, Math.ceil(cw), Math.ceil(ch));
      }
    }
    ctx.fillStyle = "#7a8397";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    const ky = Math.max(1, Math.ceil(12 / ch));
    for (let k = 0; k < c; k += ky) ctx.fillText(String(k), m.l - 5, m.t + (k + 0.5) * ch);
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const kx = Math.max(1, Math.ceil(26 / cw));
    for (let i = 0; i < n; i += kx) ctx.fillText(String(i), m.l + (i + 0.5) * cw, h - m.b + 4);
    $("#heat-max").textContent = fmtPct(maxShare);
    fig._heat = { m, cw, ch, n, c, counts, shares };
  }

  function attachHeatHover() {
    const fig = $("#heatmap");
    const canvas = fig.querySelector("canvas");
    const tip = fig.querySelector(".tip");
    canvas.addEventListener("mousemove", (ev) => {
      const g = fig._heat;
      if (!g) return;
      const rect = canvas.getBoundingClientRect();
      const i = Math.floor((ev.clientX - rect.left - g.m.l) / g.cw), k = Math.floor((ev.clientY - rect.top - g.m.t) / g.ch);
      if (i < 0 || k < 0 || i >= g.n || k >= g.c) { tip.hidden = true; return; }
      tip.textContent = `client ${i}, class ${k}\n${g.counts[i][k]} samples (${fmtPct(g.shares[i][k])})`;
      tip.hidden = false;
      tip.style.left = Math.min(ev.clientX - rect.left + 12, rect.width - tip.offsetWidth - 4) + "px";
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  }

  // ---- clients table and estimator report ---------------------------------------------------------------------
  function cell(textValue, cls) {
    const td = document.createElement("td");
    td.textContent = textValue;
    if (cls) td.className = cls;
    return td;
  }

  function renderClients() {
    const table = $("#clients");
    const rows = state.clients ? state.clients.clients : [];
    const counts = { ok: 0, stale: 0, down: 0, unknown: 0, finished: 0, stopped: 0 };
    const trs = rows.map((c) => {
      counts[c.health] = (counts[c.health] || 0) + 1;
      const tr = document.createElement("tr");
      tr.dataset.cid = String(c.cid);
      const health = document.createElement("span");
      health.className = "health";
      health.dataset.health = c.health;
      health.textContent = c.health;
      const htd = document.createElement("td");
      htd.append(health);
      const traffic = c.bytes_sent !== null || c.bytes_received !== null
        ? `↑${fmtBytes(c.bytes_sent)} ↓${fmtBytes(c.bytes_received)}` : fmtBytes(c.bytes_total);
      tr.append(
        cell(String(c.cid)), htd, cell(c.state || "–"), cell(c.worker || "–"), cell(c.device || "–"),
        cell(c.samples === null ? "–" : String(c.samples), "num"), cell(String(c.participation), "num"),
        cell(traffic, "num"), cell(fmtNum(c.eta), "num"), cell(fmtNum(c.eta_star), "num"),
        cell(fmtAge(c.heartbeat_age_s), "num"), cell(c.data_source || "–"),
      );
      return tr;
    });
    table.tBodies[0].replaceChildren(...trs);
    table.dataset.rows = String(trs.length);
    const parts = [`${rows.length} clients`];
    for (const k of ["ok", "stale", "down", "finished", "stopped"]) if (counts[k]) parts.push(`${counts[k]} ${k}`);
    if (state.clients && state.clients.source !== "clients.json") parts.push(`from ${state.clients.source}`);
    $("#clients-summary").textContent = parts.join(" · ");
  }

  function summarise(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") return fmtNum(v);
    if (typeof v === "boolean" || typeof v === "string") return String(v);
    if (Array.isArray(v)) {
      if (v.length <= 4 && v.every((x) => typeof x !== "object")) return v.map(summarise).join(", ");
      return `[${v.length} values]`;
    }
    return Object.keys(v).length + " fields";
  }

  function renderEstimator() {
    const e = state.estimator;
    const dl = $("#estimator-report");
    const items = [];
    const add = (k, v) => {
      const dt = document.createElement("dt"); dt.textContent = k;
      const dd = document.createElement("dd"); dd.textContent = v;
      items.push(dt, dd);
    };
    if (!e || !e.available) {
      add("status", "no estimator data (FedEnt runs only)");
    } else {
      $("#estimator-mode").textContent = e.mode ? `mode: ${e.mode}` : "";
      const withBoth = e.trajectory.filter((p) => p.phi2_pred !== null && p.phi2_actual !== null);
      add("rounds tracked", String(e.trajectory.length));
      if (withBoth.length) {
        const last = withBoth[withBoth.length - 1];
        const rel = Math.abs(last.phi2_pred - last.phi2_actual) / Math.max(Math.abs(last.phi2_actual), 1e-12);
        add("last φ2 pred / actual", `${fmtNum(last.phi2_pred)} / ${fmtNum(last.phi2_actual)} (${fmtNum(100 * rel, 2)}% off)`);
      }
      const guards = e.trajectory.reduce((a, p) => a + (p.guards || 0), 0);
      add("guards fired", String(guards));
      for (const [k, v] of Object.entries(e.report).slice(0, 14)) add(k, summarise(v));
    }
    dl.replaceChildren(...items);
  }

  // ---- start ------------------------------------------------------------------------------------------------
  for (const id of ["#chart-accuracy", "#chart-loss", "#chart-phi2", "#chart-eta", "#chart-entropy"]) attachHover($(id));
  attachHeatHover();
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => { renderCharts(); renderHeatmap(); }, 150);
  });
  setInterval(tickClock, 1000);
  if (loadInitial()) render(); // first paint with data, before any fetch
  refresh(null);
  connect();
})();
