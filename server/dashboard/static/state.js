/* The page's state (what the API last answered) and its first fill from the server-rendered #initial-data block.
 * The server embeds the run's state in the page (the API's own JSON), so the first paint is drawn from it
 * before any fetch; live.js keeps it current. Exposed as window.fedentDashboard by main.js (debugging, tests). */

export const state = {
  status: null, statusAt: 0, rounds: [], clients: null, estimator: null, partition: null,
  refreshing: false, pending: null, pendingWanted: false, refreshes: 0, source: null, initial: false,
};

/** The state the server rendered into the page (absent when the dashboard needs a token). */
export function loadInitial() {
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
