/* The estimator's charts, from its per-round trajectory (estimator.json, /api/estimator): φ2 predicted vs
 * actual Σθ‖w_i‖², and the entropy of the uploaded models. */

import { $ } from "./dom.js";
import { PALETTE, drawLineChart, pointsOf } from "./linechart.js";

export function renderPhi2Charts(estimator) {
  const traj = estimator ? estimator.trajectory : [];
  drawLineChart($("#chart-phi2"), [
    { name: "predicted φ2", color: PALETTE[4], dashed: true, points: pointsOf(traj, (p) => p.phi2_pred) },
    { name: "actual φ2", color: PALETTE[0], points: pointsOf(traj, (p) => p.phi2_actual) },
  ], { empty: "no estimator data (FedEnt runs only)" });
  drawLineChart($("#chart-entropy"), [
    { name: "entropy", color: PALETTE[2], points: pointsOf(traj, (p) => p.entropy) },
  ], { empty: "no entropy data (FedEnt runs only)" });
}
