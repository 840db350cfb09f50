/* Formatting of numbers, percentages, durations, bytes and ages for the page's text, tooltips and ticks.
 * server/dashboard/page.py renders the header with the same rules (fmt_pct, fmt_duration) for the first paint. */

export const DASH = "–"; // "no value"

export function fmtNum(v, digits = 4) {
  if (v === null || v === undefined || !Number.isFinite(v)) return DASH;
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  return Number(v.toPrecision(digits)).toString();
}

/** A tick label with just enough decimals to tell neighbouring ticks ``step`` apart. */
export function fmtTick(v, step, percent) {
  const scale = percent ? 100 : 1;
  const a = Math.abs(v * scale), st = step * scale;
  if (a !== 0 && (a >= 1e6 || (a < 1e-3 && st < 1e-4))) return v.toExponential(1);
  const dec = Math.min(10, Math.max(0, Math.ceil(-Math.log10(st) + 1e-9)));
  return (v * scale).toFixed(dec) + (percent ? "%" : "");
}

/** The run's privacy so far (page.py ``fmt_epsilon``): "off", "central ε 3.21", "local ε ∞". */
export function fmtEpsilon(p) {
  if (!p) return "off";
  return `${p.dp || "dp"} ε ` + (p.epsilon === null || p.epsilon === undefined ? "∞" : p.epsilon.toFixed(2));
}

export function fmtPct(v) { return v === null || v === undefined ? DASH : (100 * v).toFixed(1) + "%"; }

export function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return DASH;
  s = Math.max(0, s);
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
  return h > 0 ? `${h} h ${String(m).padStart(2, "0")} m` : `${m} m ${String(sec).padStart(2, "0")} s`;
}

export function fmtBytes(b) {
  if (b === null || b === undefined) return DASH;
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (b >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return (i === 0 ? b : b.toFixed(b < 10 ? 2 : 1)) + " " + units[i];
}

export function fmtAge(s) {
  if (s === null || s === undefined) return DASH;
  return s < 1 ? "now" : fmtDuration(s) + " ago";
}
