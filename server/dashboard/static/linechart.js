/* The line chart every per-round figure uses: axes and ticks, one line per series, the legend and the hover
 * tooltip. Hand-written on a canvas; each chart exposes what it drew as data-* attributes on its <figure>
 * (data-points, data-series, data-last) so tests and scripts can read the page without parsing pixels.
 * A series is {name, color, points: [[round, y], ...], dash?, marker?}: dash "solid" (default), "dashed" or
 * "dotted"; marker "o" (circle, default) or "s" (square), the vocabulary of fedent/phi2_style.json. */

import { setupCanvas } from "./canvas.js";
import { fmtNum, fmtTick } from "./format.js";

export const PALETTE = ["#2f6fde", "#e4572e", "#17a398", "#f3a712", "#8e44ad", "#c0392b", "#3d9970", "#ff6f91",
  "#4b6584", "#a0522d", "#0fb9b1", "#6c5ce7"];

const DASHES = { solid: [], dashed: [5, 4], dotted: [1.5, 3] };

/** [round, y] of every row where ``get`` gives a finite number. */
export function pointsOf(rows, get) {
  const out = [];
  for (const r of rows) {
    const y = get(r);
    if (y !== null && y !== undefined && Number.isFinite(y)) out.push([r.round, y]);
  }
  return out;
}

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

export function drawLineChart(fig, series, opts, hoverX = null) {
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
    ctx.setLineDash(DASHES[s.dash] || []);
    ctx.beginPath();
    s.points.forEach(([x, y], i) => (i === 0 ? ctx.moveTo(px(x), py(y)) : ctx.lineTo(px(x), py(y))));
    ctx.stroke();
    ctx.setLineDash([]);
    if (s.points.length <= 40 || s.points.length === 1) {
      const r = many ? 1.6 : 2.4;
      for (const [x, y] of s.points) {
        if (s.marker === "s") { ctx.fillRect(px(x) - r * 0.9, py(y) - r * 0.9, r * 1.8, r * 1.8); continue; }
        ctx.beginPath(); ctx.arc(px(x), py(y), r, 0, 2 * Math.PI); ctx.fill();
      }
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
    sw.className = "sw" + (s.dash === "dashed" || s.dash === "dotted" ? " " + s.dash : "");
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

/** The tooltip and crosshair of a chart's canvas: the values of every series at the round under the mouse. */
export function attachHover(fig) {
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
