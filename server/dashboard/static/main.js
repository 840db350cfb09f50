/* FedEnt dashboard page, main wiring: the one <script type="module"> of index.html. It draws the first paint
 * from the state the server embedded (#initial-data), then keeps the page current from /api/* and the
 * /api/events stream (live.js). Native ES modules, hand-written, no build step and no dependencies:
 *   api.js (token, fetches) · format.js · dom.js · state.js · live.js (refresh, SSE) · status.js (header)
 *   canvas.js · linechart.js · rounds.js (accuracy, loss, η) · phi2.js (φ2, entropy) · heatmap.js
 *   clients.js (table) · estimator.js (report card) */

import { $ } from "./dom.js";
import { renderClients } from "./clients.js";
import { renderEstimator } from "./estimator.js";
import { attachHeatHover, renderHeatmap } from "./heatmap.js";
import { attachHover } from "./linechart.js";
import { connect, onRefreshed, refresh } from "./live.js";
import { renderPhi2Charts } from "./phi2.js";
import { renderRoundCharts } from "./rounds.js";
import { loadInitial, state } from "./state.js";
import { renderStatus, tickClock } from "./status.js";

window.fedentDashboard = state; // for debugging in the console (the token is not in it: api.js keeps it)

function renderCharts() {
  renderRoundCharts(state.rounds);
  renderPhi2Charts(state.estimator);
}

function render() {
  renderStatus();
  renderCharts();
  renderHeatmap(state.partition);
  renderClients(state.clients);
  renderEstimator(state.estimator);
  $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
}

for (const id of ["#chart-accuracy", "#chart-loss", "#chart-phi2", "#chart-eta", "#chart-entropy"]) attachHover($(id));
attachHeatHover();
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { renderCharts(); renderHeatmap(state.partition); }, 150);
});
setInterval(tickClock, 1000);
onRefreshed(render);
if (loadInitial()) render(); // first paint with data, before any fetch
refresh(null);
connect();
