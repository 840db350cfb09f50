/* The header and progress bar: run id, algorithm, rounds done, phase, elapsed/ETA clock, last test accuracy.
 * page.py renders the same text on the server for the first paint (header_fields). */

import { $, showError } from "./dom.js";
import { fmtDuration, fmtEpsilon, fmtPct } from "./format.js";
import { state } from "./state.js";

const PHASES = ["starting", "estimating", "training", "aggregating", "evaluating", "done", "stopped", "failed"];
const ENDED = ["done", "stopped", "failed"];

export function renderStatus() {
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
  const priv = state.rounds.filter((r) => r.privacy);
  $("#epsilon").textContent = fmtEpsilon(priv.length ? priv[priv.length - 1].privacy : null);

  const prog = $(".progress");
  prog.dataset.phase = s.phase;
  const pct = Math.round(1000 * s.progress) / 10;
  $("#progress-fill").style.width = pct + "%";
  $("#progress").setAttribute("aria-valuenow", String(pct));
  const cur = PHASES.indexOf(s.phase);
  for (const li of document.querySelectorAll("#phases li")) {
    const i = PHASES.indexOf(li.dataset.phase);
    li.classList.toggle("current", i === cur);
    li.classList.toggle("past", cur >= 0 && i < cur && !ENDED.includes(li.dataset.phase));
  }
  // rounds are 1..R everywhere (fedent.runlog): round k is in flight while k-1 rounds are complete
  const inFlight = s.round !== null && s.round > s.rounds_completed && !ENDED.includes(s.phase);
  const working = inFlight ? ` · round ${s.round} ${s.phase}` : "";
  $("#progress-text").textContent = `${s.rounds_completed} / ${s.rounds ?? "?"} rounds · ${pct}%${working}`;
  if (s.phase === "failed") showError("Run failed" + (s.error ? ": " + s.error : "."));
}

/** Elapsed and ETA, advanced every second between status updates while the run is active. */
export function tickClock() {
  const s = state.status;
  if (!s) return;
  const active = s.phase !== "done" && s.phase !== "failed" && s.phase !== "unknown";
  const extra = active ? (Date.now() - state.statusAt) / 1000 : 0;
  $("#elapsed").textContent = fmtDuration(s.elapsed_s === null ? null : s.elapsed_s + extra);
  $("#eta").textContent = s.phase === "done" ? "done" : fmtDuration(s.eta_s === null ? null : Math.max(0, s.eta_s - extra));
}
