// The dashboard's entry: routes by the address's fragment (#/, #/run/<id>, #/compare/<ids>),
// so that a reload or a shared link shows the same view; keeps the token box.
import * as api from "./api.js";
import * as comparePage from "./compare_page.js";
import { clear, toast } from "./dom.js";
import * as runPage from "./run_page.js";
import * as runsPage from "./runs_page.js";

const routes = [
  [/^#\/run\/([^/]+)$/, (view, m) => runPage.mount(view, decodeURIComponent(m[1]))],
  [/^#\/compare(?:\/(.*))?$/, (view, m) => comparePage.mount(view, m[1])],
  [/^(#\/?)?$/, (view) => runsPage.mount(view)],
];

let unmount = null;
function route() {
  const view = document.getElementById("view");
  if (unmount) unmount();
  unmount = null;
  clear(view);
  const hash = window.location.hash;
  for (const [pattern, mount] of routes) {
    const m = hash.match(pattern);
    if (m) {
      unmount = mount(view, m);
      break;
    }
  }
  if (!unmount) view.textContent = `No page ${hash}`;
  document.getElementById("nav-runs").classList.toggle("here", !hash || hash === "#/");
  document.getElementById("nav-compare").classList.toggle("here", hash.startsWith("#/compare"));
}

function tokenBox() {
  const form = document.getElementById("token-form");
  const input = document.getElementById("token");
  input.value = api.token.get();
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    api.token.set(input.value.trim());
    toast(input.value.trim() ? "token saved in this browser" : "token removed");
  });
}

async function daemonLine() {
  try {
    const info = await api.info();
    document.getElementById("daemon").textContent =
      `tided ${info.version} · ${info.scheduler} · ${info.slots.used}/${info.slots.total} CPU slots` +
      (info.gpus.devices.length ? ` · ${info.gpus.free.length}/${info.gpus.devices.length} GPUs free` : "");
  } catch (e) {
    toast(`tided: ${e.message}`, true);
  }
}

window.addEventListener("hashchange", route);
tokenBox();
daemonLine();
route();
