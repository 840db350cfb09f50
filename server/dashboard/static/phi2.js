/* The estimator's charts, from its per-round trajectory (estimator.json, /api/estimator): φ2 predicted vs
 * actual Σθ‖w_i‖², and the entropy of the uploaded models. The two φ2 series are styled by the page's
 * #phi2-style block, which the server fills from fedent/phi2_style.json, the file `fedent plot` draws them
 * with: no label or colour of theirs is written here. */

import { $ } from "./dom.js";
import { PALETTE, drawLineChart, pointsOf } from "./linechart.js";

const UNSTYLED = "#7a8397"; // only if the block is missing or broken: the keys, in grey, rather than no chart

/** [{key, label, color, dash, marker}, ...] in legend order, as the server embedded it. */
function readStyle() {
  const el = document.getElementById("phi2-style");
  try {
    const series = JSON.parse(el.textContent).series;
    if (Array.isArray(series) && series.length) return series;
  } catch (e) { /* fall through */ }
  return ["phi2_pred", "phi2_actual"].map((key) => ({ key, label: key, color: UNSTYLED, dash: "solid", marker: "o" }));
}

const STYLE = readStyle();

export function renderPhi2Charts(estimator) {
  const traj = estimator ? estimator.trajectory : [];
  drawLineChart($("#chart-phi2"), STYLE.map((st) => ({
    name: st.label, color: st.color, dash: st.dash, marker: st.marker, points: pointsOf(traj, (p) => p[st.key]),
  })), { empty: "no estimator data (FedEnt runs only)" });
  drawLineChart($("#chart-entropy"), [
    { name: "entropy", color: PALETTE[2], points: pointsOf(traj, (p) => p.entropy) },
  ], { empty: "no entropy data (FedEnt runs only)" });
}
