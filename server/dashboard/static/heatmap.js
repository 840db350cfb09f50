/* The partition heatmap (partition.json, /api/partition): one column per client, one row per class, coloured by
 * the share of the client's samples in that class; hover shows the count. */

import { setupCanvas } from "./canvas.js";
import { $ } from "./dom.js";
import { fmtPct } from "./format.js";

const HEAT_STOPS = [[243, 246, 252], [158, 192, 245], [47, 111, 222], [23, 48, 107]];

function heatColor(t) {
  t = Math.min(1, Math.max(0, t)) * (HEAT_STOPS.length - 1);
  const i = Math.min(HEAT_STOPS.length - 2, Math.floor(t)), f = t - i;
  const a = HEAT_STOPS[i], b = HEAT_STOPS[i + 1];
  return `rgb(${a.map((v, k) => Math.round(v + f * (b[k] - v))).join(",")})`;
}

export function renderHeatmap(p) {
  const fig = $("#heatmap");
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

export function attachHeatHover() {
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
