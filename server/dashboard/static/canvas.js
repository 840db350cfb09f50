/* A canvas sized to its CSS box at the device pixel ratio, cleared, with the charts' font: shared by the line
 * charts and the partition heatmap. */

export function setupCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(50, canvas.clientWidth), h = Math.max(50, canvas.clientHeight);
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, w, h };
}
