// The runs page: every run the daemon holds, newest first, updated from the event stream.
import * as api from "./api.js";
import { throttle } from "./charts.js";
import { clear, duration, el, layoutText, num, percent, toast } from "./dom.js";

const STATES = ["queued", "starting", "running", "paused", "stopping", "restarting", "completed", "stopped", "failed", "cancelled"];

// Seconds left: the steps still to train at the latest step's time.
export function eta(run) {
  const m = run.metrics;
  if (!m || !m.step_seconds || !["running", "starting"].includes(run.state)) return NaN;
  return (run.total_steps - run.last_step) * m.step_seconds;
}

function row(run) {
  const m = run.metrics || {};
  return el(
    "tr",
    { "data-run": run.id, class: `state-${run.state}` },
    el("td", {}, el("a", { href: `#/run/${encodeURIComponent(run.id)}` }, run.id)),
    el("td", {}, el("span", { class: `badge ${run.state}` }, run.state)),
    el("td", { title: run.recipe_source }, run.name),
    el("td", {}, layoutText(run.layout)),
    el("td", { class: "num" }, run.workers),
    el("td", { class: "num step" }, `${run.last_step} / ${run.total_steps}`),
    el("td", { class: "num" }, duration(eta(run))),
    el("td", { class: "num loss" }, num(m.loss)),
    el("td", { class: "num" }, num(m.tokens_per_second, 3)),
    el("td", { class: "num" }, m.mfu === undefined ? "–" : percent(m.mfu)),
    el("td", { class: "error-text" }, run.error || ""),
  );
}

export function mount(view) {
  const filter = el(
    "select",
    { id: "state-filter" },
    el("option", { value: "" }, "all states"),
    STATES.map((s) => el("option", { value: s }, s)),
  );
  const counts = el("span", { class: "muted", id: "run-counts" });
  const body = el("tbody", { id: "runs" });
  view.append(
    el("div", { class: "toolbar" }, el("h1", {}, "Runs"), filter, counts),
    el(
      "table",
      { class: "runs" },
      el(
        "thead",
        {},
        el(
          "tr",
          {},
          ["run", "state", "recipe", "layout", "workers", "step", "ETA", "loss", "tokens/s", "MFU", ""].map((h) =>
            el("th", {}, h),
          ),
        ),
      ),
      body,
    ),
  );

  let runs = [];
  const draw = () => {
    clear(body);
    const shown = runs.filter((r) => !filter.value || r.state === filter.value);
    for (const r of [...shown].reverse()) body.append(row(r));
    const by = {};
    for (const r of runs) by[r.state] = (by[r.state] || 0) + 1;
    counts.textContent = Object.entries(by)
      .map(([s, n]) => `${n} ${s}`)
      .join(" · ");
    if (!runs.length) body.append(el("tr", {}, el("td", { colspan: 11, class: "muted" }, "No runs yet: tide submit RECIPE")));
  };
  const redraw = throttle(draw, 300);
  const reload = throttle(async () => {
    try {
      runs = await api.runs();
      draw();
    } catch (e) {
      toast(`runs: ${e.message}`, true);
    }
  }, 500);
  filter.addEventListener("change", draw);

  const source = api.events(null, (kind, event) => {
    const r = runs.find((x) => x.id === event.run);
    if (kind === "metrics" && r) {
      r.metrics = event.body;
      r.last_step = event.body.step;
      redraw();
    } else if (kind === "state" || kind === "scheduler" || !r) {
      reload();
    }
  });
  reload();
  return () => source.close();
}
