/* API fetching: the dashboard token (?token= once, then sessionStorage) and authorised JSON fetches of /api/*.
 * The token lives only in this module, never in the state the page exposes on window. */

export class AuthError extends Error {}

// ---- token: ?token= once, then kept in sessionStorage and removed from the address bar ----------
function readToken() {
  const params = new URLSearchParams(window.location.search);
  let tok = params.get("token");
  try {
    if (tok) sessionStorage.setItem("fedent-token", tok);
    else tok = sessionStorage.getItem("fedent-token");
  } catch (e) { /* storage disabled: keep the token in memory only */ }
  if (params.has("token")) {
    params.delete("token");
    const q = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (q ? "?" + q : "") + window.location.hash);
  }
  return tok || null;
}

const token = readToken(); // read once, when the page's modules are first evaluated

export async function getJSON(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const r = await fetch(path, { headers, cache: "no-store" });
  if (r.status === 401) throw new AuthError("unauthorized");
  if (!r.ok) throw new Error(path.split("?")[0] + ": HTTP " + r.status);
  return r.json();
}

/** The SSE URL: EventSource sends no headers, so the token goes in the query (only /api/events accepts it). */
export function eventsUrl() {
  return "api/events" + (token ? "?token=" + encodeURIComponent(token) : "");
}
