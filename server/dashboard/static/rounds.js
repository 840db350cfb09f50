/* The charts drawn from the per-round metrics (metrics.jsonl, /api/rounds): test accuracy, test and training
 * loss, the cluster's bytes on the wire per round (diagnostics.transfer), and FedEnt's per-client learning rate η_i
 * (log scale when the rates span more than two decades). */

import { $ } from "./dom.js";
import { fmtPct } from "./format.js";
import { PALETTE, drawLineChart, pointsOf } from "./linechart.js";

export function renderRoundCharts(rounds) {
  drawLineChart($("#chart-accuracy"), [
    { name: "test accuracy", color: PALETTE[0], points: pointsOf(rounds, (r) => r.test_acc) },
  ], { yMin: 0, yMax: 1, percent: true, format: fmtPct, empty: "no evaluation yet" });
  drawLineChart($("#chart-loss"), [
    { name: "test loss", color: PALETTE[1], points: pointsOf(rounds, (r) => r.test_loss) },
    { name: "train loss", color: PALETTE[2], dash: "dashed", points: pointsOf(rounds, (r) => r.train_loss) },
  ], { empty: "no losses yet" });
  const mb = (key) => (r) => {
    const t = r.diagnostics && r.diagnostics.transfer;
    return t && Number.isFinite(t[key]) ? t[key] / 1e6 : null;
  };
  drawLineChart($("#chart-bytes"), [
    { name: "up (updates)", color: PALETTE[3], points: pointsOf(rounds, mb("bytes_up")) },
    { name: "down (models)", color: PALETTE[4], dash: "dashed", points: pointsOf(rounds, mb("bytes_down")) },
  ], { yMin: 0, empty: "no bytes on the wire (a simulator run)" });

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
