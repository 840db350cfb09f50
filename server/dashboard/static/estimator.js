/* The estimator report card (/api/estimator): rounds tracked, the last φ2 prediction against the actual value,
 * guards fired, and the first fields of the estimator's own report. */

import { $ } from "./dom.js";
import { fmtNum } from "./format.js";

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

export function renderEstimator(e) {
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
