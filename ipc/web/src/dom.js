// What every page uses: elements built from data (never from HTML text, so nothing a run
// reports can become markup), number formats, and the status line at the bottom.

export function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") e.className = value;
    else if (key.startsWith("on")) e.addEventListener(key.slice(2), value);
    else if (key === "value" || key === "checked") e[key] = value;
    else e.setAttribute(key, value === true ? "" : String(value));
  }
  append(e, children);
  return e;
}

export function append(parent, children) {
  for (const c of [children].flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    parent.append(c instanceof Node ? c : String(c));
  }
  return parent;
}

export function clear(e) {
  while (e.firstChild) e.firstChild.remove();
  return e;
}

export function num(x, digits = 4) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (!Number.isFinite(x)) return String(x);
  // JavaScript writes 5e-7 and 0.0005 itself; only large counts need the exponent.
  if (Math.abs(x) >= 1e7) return x.toExponential(2);
  return Number(x.toPrecision(digits)).toString();
}

export function percent(x) {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`;
}

export function duration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "–";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

export function bytes(n) {
  if (!Number.isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) (n /= 1024), ++i;
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function when(unixSeconds) {
  return unixSeconds ? new Date(unixSeconds * 1000).toLocaleString() : "–";
}

let toastTimer = 0;
export function toast(message, isError = false) {
  const t = document.getElementById("toast");
  t.textContent = message;
  t.className = isError ? "error shown" : "shown";
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (t.className = ""), isError ? 8000 : 3000);
}

// The run's layout in the notation of the field: dp×tp×pp, ZeRO stage, device.
export function layoutText(layout) {
  if (!layout || layout.dp === undefined) return "–";
  let text = `${layout.dp}×${layout.tp}×${layout.pp}`;
  if (layout.cp > 1) text += ` cp${layout.cp}`;
  if (layout.ep > 1) text += ` ep${layout.ep}`;
  if (layout.zero) text += ` ZeRO-${layout.zero}${layout.offload ? "+offload" : ""}`;
  return `${text} ${layout.device || ""}`.trim();
}
