/* Keeping the state current: re-reading what changed from /api/* (new rounds by offset) and following the
 * /api/events Server-Sent Events stream (polling every 5 s where EventSource is missing). After each
 * successful refresh it calls the renderer main.js registered with onRefreshed. */

import { AuthError, eventsUrl, getJSON } from "./api.js";
import { hideError, setLive, showError } from "./dom.js";
import { state } from "./state.js";

let render = () => {};

/** Set what draws the page once fresh data is in. */
export function onRefreshed(fn) { render = fn; }

async function loadRounds() {
  let offset = state.rounds.length;
  for (let guard = 0; guard < 10000; guard++) {
    const page = await getJSON(`api/rounds?offset=${offset}&limit=1000`);
    if (page.total < state.rounds.length) { // the log was replaced: start over
      state.rounds = [];
      offset = 0;
      continue;
    }
    state.rounds.push(...page.items);
    offset += page.items.length;
    if (page.items.length === 0 || offset >= page.total) return;
  }
}

/** Re-read what changed (files named by the SSE event) or everything (files = null). */
export async function refresh(files) {
  if (state.refreshing) { // coalesce bursts of events into one follow-up refresh
    if (!state.pendingWanted) { state.pending = files; state.pendingWanted = true; }
    else if (state.pending !== null) state.pending = files === null ? null : state.pending.concat(files);
    return;
  }
  state.refreshing = true;
  const want = (...names) => files === null || names.some((n) => files.includes(n));
  try {
    const jobs = [getJSON("api/status").then((s) => { state.status = s; state.statusAt = Date.now(); })];
    if (want("metrics.jsonl")) jobs.push(loadRounds());
    if (want("clients.json", "metrics.jsonl", "partition.json", "status.json")) {
      jobs.push(getJSON("api/clients").then((c) => { state.clients = c; }));
    }
    if (want("estimator.json", "metrics.jsonl")) jobs.push(getJSON("api/estimator").then((e) => { state.estimator = e; }));
    if (want("partition.json") || state.partition === null) {
      jobs.push(getJSON("api/partition").then((p) => { state.partition = p; }));
    }
    await Promise.all(jobs);
    state.refreshes++;
    hideError();
    render();
  } catch (e) {
    if (e instanceof AuthError) {
      setLive("unauthorized");
      showError("Unauthorized: this dashboard needs a token. Open the page as /?token=YOUR_TOKEN.");
    } else {
      showError("Could not load data: " + e.message);
    }
  } finally {
    state.refreshing = false;
    if (state.pendingWanted) {
      const next = state.pending;
      state.pending = null;
      state.pendingWanted = false;
      refresh(next);
    }
  }
}

// ---- live updates ----------------------------------------------------------------------------------
export function connect() {
  if (typeof EventSource === "undefined") { setLive("polling"); setInterval(() => refresh(null), 5000); return; }
  const es = new EventSource(eventsUrl());
  state.source = es;
  es.addEventListener("hello", () => { setLive("live"); refresh(null); });
  es.addEventListener("change", (ev) => {
    let files = null;
    try { files = JSON.parse(ev.data).files || null; } catch (e) { files = null; }
    refresh(files);
  });
  es.addEventListener("error", () => {
    if (es.readyState === EventSource.CLOSED) { // e.g. 401 or server gone: retry slowly ourselves
      setLive("reconnecting");
      setTimeout(connect, 3000);
    } else {
      setLive("reconnecting");
    }
  });
}
