// Charts of metrics against the step (uPlot), with the two view settings training
// dashboards have: smoothing (TensorBoard's debiased exponential moving average) and a
// log-scale y axis. The settings live in localStorage, so a reload keeps the view.
/* global uPlot */
import { el, num } from "./dom.js";

const VIEW_KEY = "tide.dashboard.view";

export const viewSettings = {
  get() {
    const fallback = { smoothing: 0, log: false };
    try {
      return { ...fallback, ...JSON.parse(localStorage.getItem(VIEW_KEY) || "{}") };
    } catch {
      return fallback;
    }
  },
  set(settings) {
    localStorage.setItem(VIEW_KEY, JSON.stringify(settings));
  },
};

// Debiased EMA (as TensorBoard's slider): the first points are not pulled towards 0.
export function smooth(values, weight) {
  if (!(weight > 0)) return values;
  let ema = 0;
  let n = 0;
  return values.map((v) => {
    if (v === null || v === undefined || !Number.isFinite(v)) return null;
    ema = ema * weight + (1 - weight) * v;
    n += 1;
    return ema / (1 - weight ** n);
  });
}

export const PALETTE = ["#1f6feb", "#d9480f", "#2f9e44", "#ae3ec9", "#e8590c", "#0c8599", "#c2255c", "#5c940d"];

function seriesOptions(s) {
  const color = s.color || PALETTE[0];
  if (s.kind === "points")
    return { label: s.label, stroke: color, fill: color, paths: () => null, points: { show: true, size: 9, fill: color } };
  if (s.kind === "faint") return { label: s.label, stroke: `${color}66`, width: 1, spanGaps: true, points: { show: false } };
  return { label: s.label, stroke: color, width: 1.5, spanGaps: true, points: { show: false } };
}

// A chart of `series` ([{label, color, kind: "line"|"faint"|"points"}]) against the step.
export class StepChart {
  constructor(parent, title, series, { log = false, height = 200, sync = "tide", id } = {}) {
    this.title = title;
    this.series = series;
    this.log = log;
    this.height = height;
    this.sync = sync;
    this.box = el("div", { class: "chart", id });
    parent.append(this.box);
    this.x = [];
    this.columns = series.map(() => []);
    this.build();
  }

  build() {
    if (this.plot) this.plot.destroy();
    const opts = {
      title: this.title,
      width: this.width(),
      height: this.height,
      scales: { x: { time: false }, y: this.log ? { distr: 3, log: 10 } : {} },
      axes: [{ label: "step" }, { size: 60, values: (u, ticks) => ticks.map((v) => (v === null ? "" : num(v, 3))) }],
      series: [{ label: "step" }, ...this.series.map(seriesOptions)],
      cursor: { sync: { key: this.sync } },
    };
    this.plot = new uPlot(opts, this.shown(), this.box);
  }

  width() {
    return Math.max(240, (this.box.clientWidth || this.box.parentElement.clientWidth || 480) - 4);
  }

  // On a log scale only positive values can be drawn.
  shown() {
    const columns = this.log ? this.columns.map((c) => c.map((v) => (v > 0 ? v : null))) : this.columns;
    return [this.x, ...columns];
  }

  setData(x, columns) {
    this.x = x;
    this.columns = columns;
    this.plot.setData(this.shown());
    // What is drawn, for tests and tools: how many steps, from which one.
    this.box.dataset.points = String(x.length);
    this.box.dataset.firstStep = x.length ? String(x[0]) : "";
  }

  // Another list of series (a data blend's datasets, as rows name them): the chart is
  // built again when their labels change.
  setSeries(series) {
    if (series.map((s) => s.label).join("\n") === this.series.map((s) => s.label).join("\n")) return;
    this.series = series;
    this.columns = series.map(() => []);
    this.build();
  }

  setLog(log) {
    if (log === this.log) return;
    this.log = log;
    this.build();
  }

  resize() {
    this.plot.setSize({ width: this.width(), height: this.height });
  }

  destroy() {
    this.plot.destroy();
  }
}

// Calls `draw` at most once per `ms`, however often `request` is called: a run may step
// many times a second.
export function throttle(draw, ms = 300) {
  let timer = 0;
  return () => {
    if (timer) return;
    timer = setTimeout(() => {
      timer = 0;
      draw();
    }, ms);
  };
}
