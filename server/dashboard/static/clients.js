/* The clients table (/api/clients): health, state, worker, device, samples, rounds, traffic, η, η*, heartbeat
 * age, data source and last failure (a rejected upload says why) per client, and the summary line above it
 * (counts per health, and how many clients the engine rejected). */

import { $ } from "./dom.js";
import { fmtAge, fmtBytes, fmtNum } from "./format.js";

function cell(textValue, cls) {
  const td = document.createElement("td");
  td.textContent = textValue;
  if (cls) td.className = cls;
  return td;
}

export function renderClients(clients) {
  const table = $("#clients");
  const rows = clients ? clients.clients : [];
  const counts = { ok: 0, stale: 0, down: 0, unknown: 0, finished: 0, stopped: 0 };
  const trs = rows.map((c) => {
    counts[c.health] = (counts[c.health] || 0) + 1;
    const tr = document.createElement("tr");
    tr.dataset.cid = String(c.cid);
    const health = document.createElement("span");
    health.className = "health";
    health.dataset.health = c.health;
    health.textContent = c.health;
    const htd = document.createElement("td");
    htd.append(health);
    const traffic = c.bytes_sent !== null || c.bytes_received !== null
      ? `↑${fmtBytes(c.bytes_sent)} ↓${fmtBytes(c.bytes_received)}` : fmtBytes(c.bytes_total);
    tr.append(
      cell(String(c.cid)), htd, cell(c.state || "–"), cell(c.worker || "–"), cell(c.device || "–"),
      cell(c.samples === null ? "–" : String(c.samples), "num"), cell(String(c.participation), "num"),
      cell(traffic, "num"), cell(fmtNum(c.eta), "num"), cell(fmtNum(c.eta_star), "num"),
      cell(fmtAge(c.heartbeat_age_s), "num"), cell(c.data_source || "–"), cell(c.last_failure || "–", "failure"),
    );
    return tr;
  });
  table.tBodies[0].replaceChildren(...trs);
  table.dataset.rows = String(trs.length);
  const parts = [`${rows.length} clients`];
  for (const k of ["ok", "stale", "down", "finished", "stopped"]) if (counts[k]) parts.push(`${counts[k]} ${k}`);
  const rejected = rows.filter((c) => c.state === "rejected").length;
  if (rejected) parts.push(`${rejected} rejected`);
  if (clients && clients.source !== "clients.json") parts.push(`from ${clients.source}`);
  $("#clients-summary").textContent = parts.join(" · ");
}
