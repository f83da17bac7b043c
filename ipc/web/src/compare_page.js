// Compare: one metric of chosen runs on one chart (a learning-rate sweep, a resumed run).
// The choice is in the address (#/compare/a,b), so it can be shared and survives a reload.
import * as api from "./api.js";
import { PALETTE, StepChart, smooth, throttle, viewSettings } from "./charts.js";
import { clear, el, toast } from "./dom.js";

const METRICS = {
  loss: "loss",
  val_loss: "validation loss",
  lr: "learning rate",
  grad_norm: "gradient norm",
  tokens_per_second: "tokens / s",
  mfu: "MFU",
  step_seconds: "step time (s)",
};
const METRIC_KEY = "tide.dashboard.compare.metric";

export function mount(view, chosenText) {
  const settings = viewSettings.get();
  const chosen = new Set((chosenText || "").split(",").filter(Boolean).map(decodeURIComponent));
  const metric = el(
    "select",
    { id: "compare-metric" },
    Object.entries(METRICS).map(([k, label]) => el("option", { value: k }, label)),
  );
  metric.value = localStorage.getItem(METRIC_KEY) || "loss";
  const smoothing = el("input", { id: "smoothing", type: "range", min: 0, max: 0.99, step: 0.01, value: settings.smoothing });
  const log = el("input", { id: "log-scale", type: "checkbox", checked: settings.log });
  const list = el("ul", { class: "run-choice", id: "compare-runs" });
  const chartBox = el("div", { class: "compare-chart" });
  view.append(
    el(
      "div",
      { class: "toolbar" },
      el("h1", {}, "Compare"),
      metric,
      el("label", {}, "smoothing ", smoothing),
      el("label", {}, log, " log scale"),
    ),
    el("div", { class: "compare" }, list, chartBox),
  );

  let runs = [];
  const rows = new Map(); // run → Map(step → row)
  let chart = null;
  let chartShape = "";

  const draw = () => {
    const ids = runs.map((r) => r.id).filter((id) => chosen.has(id) && rows.has(id));
    const steps = new Set();
    for (const id of ids) for (const step of rows.get(id).keys()) steps.add(step);
    const x = [...steps].sort((a, b) => a - b);
    const key = metric.value;
    const scale = key === "mfu" ? 100 : 1;
    const columns = ids.map((id) => {
      const byStep = rows.get(id);
      const values = x.map((s) => {
        const v = byStep.get(s)?.[key];
        return v === undefined || v === null ? null : v * scale;
      });
      return key === "val_loss" || key === "lr" ? values : smooth(values, settings.smoothing);
    });
    // The same runs and metric: new points only. Otherwise a new chart.
    const shape = JSON.stringify([key, ids, settings.log]);
    if (chart && shape === chartShape) return chart.setData(x, columns);
    if (chart) chart.destroy();
    chart = null;
    chartShape = shape;
    clear(chartBox);
    if (!ids.length) return chartBox.append(el("p", { class: "muted" }, "Choose runs on the left."));
    const series = ids.map((id, i) => ({ label: id, color: PALETTE[i % PALETTE.length] }));
    chart = new StepChart(chartBox, METRICS[key], series, { log: settings.log, height: 420, id: "compare-chart", sync: "compare" });
    chart.setData(x, columns);
  };
  const redraw = throttle(draw, 400);

  const load = async (id) => {
    try {
      const byStep = new Map();
      for (const r of await api.metrics(id)) byStep.set(r.step, r);
      rows.set(id, byStep);
      draw();
    } catch (e) {
      toast(`${id}: ${e.message}`, true);
    }
  };
  const choose = (id, on) => {
    if (on) chosen.add(id);
    else chosen.delete(id);
    history.replaceState(null, "", `#/compare/${[...chosen].map(encodeURIComponent).join(",")}`);
    if (on && !rows.has(id)) load(id);
    else draw();
  };
  const drawList = () => {
    clear(list);
    for (const r of [...runs].reverse())
      list.append(
        el(
          "li",
          {},
          el(
            "label",
            {},
            el("input", { type: "checkbox", "data-run": r.id, checked: chosen.has(r.id), onchange: (e) => choose(r.id, e.target.checked) }),
            ` ${r.id} `,
            el("span", { class: `badge ${r.state}` }, r.state),
          ),
        ),
      );
  };

  metric.addEventListener("change", () => {
    localStorage.setItem(METRIC_KEY, metric.value);
    draw();
  });
  smoothing.addEventListener("input", () => {
    settings.smoothing = Number(smoothing.value);
    viewSettings.set(settings);
    draw();
  });
  log.addEventListener("change", () => {
    settings.log = log.checked;
    viewSettings.set(settings);
    draw();
  });

  const source = api.events(null, (kind, event) => {
    if (kind === "metrics" && rows.has(event.run)) {
      rows.get(event.run).set(event.body.step, event.body);
      if (chosen.has(event.run)) redraw();
    } else if (kind === "state") {
      const r = runs.find((x) => x.id === event.run);
      if (r) {
        r.state = event.body.state;
        drawList();
      } else {
        api.runs().then((all) => ((runs = all), drawList()));
      }
    }
  });
  (async () => {
    try {
      runs = await api.runs();
      drawList();
      await Promise.all([...chosen].filter((id) => runs.some((r) => r.id === id)).map(load));
      draw();
    } catch (e) {
      toast(e.message, true);
    }
  })();
  return () => {
    source.close();
    if (chart) chart.destroy();
  };
}
