/* Small DOM helpers shared by the page's modules: the query shortcut, the error banner and the live indicator. */

export const $ = (sel) => document.querySelector(sel);

export function showError(msg) { const el = $("#error"); el.textContent = msg; el.hidden = false; }
export function hideError() { $("#error").hidden = true; }
export function setLive(s) { const el = $("#live"); el.dataset.state = s; el.textContent = s; }
