// One run: its figures and curves, updated live from the run's event stream; its events,
// checkpoints, log and recipe; and its controls (which need the dashboard token).
import * as api from "./api.js";
import { PALETTE, StepChart, smooth, throttle, viewSettings } from "./charts.js";
import { append, bytes, clear, duration, el, layoutText, num, percent, toast, when } from "./dom.js";
import { eta } from "./runs_page.js";

const MiB = 1024 * 1024;
const LOG_LINES = 300;
const EVENT_LINES = 200;

// A chart of one value of each row, smoothed with the page's setting or not.
function single(id, title, label, color, value, smoothed = true) {
  return {
    id,
    title,
    series: [{ label, color }],
    columns: (rows, w) => [smoothed ? smooth(rows.map(value), w) : rows.map(value)],
  };
}

// Under a data blend, the datasets whose validation losses the rows carry (val_losses).
function blendNames(rows) {
  const names = new Set();
  for (const r of rows) for (const name of Object.keys(r.val_losses || {})) names.add(name);
  return [...names].sort();
}

// Each chart: its series and how a column is taken from the rows (smoothed or not);
// `more`: series that follow from the rows, after the fixed ones.
const CHARTS = [
  {
    id: "chart-loss",
    title: "loss",
    series: [
      { label: "loss (raw)", color: PALETTE[0], kind: "faint" },
      { label: "loss", color: PALETTE[0] },
      { label: "validation loss", color: PALETTE[1] },
      { label: "anomaly", color: "#e03131", kind: "points" },
    ],
    more: (rows) => blendNames(rows).map((name, i) => ({ label: `validation ${name}`, color: PALETTE[(i + 2) % PALETTE.length] })),
    columns: (rows, w) => {
      const loss = rows.map((r) => r.loss ?? null);
      return [
        w > 0 ? loss : loss.map(() => null),
        smooth(loss, w),
        rows.map((r) => r.val_loss ?? null),
        rows.map((r) => (r.anomaly ? r.loss ?? null : null)),
        ...blendNames(rows).map((name) => rows.map((r) => r.val_losses?.[name] ?? null)),
      ];
    },
  },
  single("chart-lr", "learning rate", "lr", PALETTE[2], (r) => r.lr, false),
  single("chart-grad-norm", "gradient norm", "grad norm", PALETTE[3], (r) => r.grad_norm ?? null),
  single("chart-throughput", "tokens / s", "tokens/s", PALETTE[4], (r) => r.tokens_per_second),
  single("chart-mfu", "MFU (%)", "MFU %", PALETTE[5], (r) => 100 * r.mfu),
  single("chart-step-time", "step time (s)", "step s", PALETTE[6], (r) => r.step_seconds),
  {
    id: "chart-time-split",
    title: "where rank 0's step went (s)",
    series: [
      { label: "compute", color: PALETTE[0] },
      { label: "communication", color: PALETTE[1] },
      { label: "data", color: PALETTE[2] },
      { label: "checkpoint stall", color: PALETTE[6] },
    ],
    columns: (rows, w) => {
      const part = (key) => rows.map((r) => r[key] ?? null);
      // Compute is what the step spent neither waiting for data nor on collectives.
      const compute = rows.map((r) =>
        r.data_seconds === undefined ? null : Math.max(0, r.step_seconds - r.data_seconds - r.comm_seconds),
      );
      return [smooth(compute, w), smooth(part("comm_seconds"), w), smooth(part("data_seconds"), w), part("checkpoint_seconds")];
    },
  },
  {
    id: "chart-memory",
    title: "memory of rank 0 (MiB)",
    series: [
      { label: "host resident", color: PALETTE[0] },
      { label: "host peak", color: PALETTE[1] },
      { label: "device peak", color: PALETTE[2] },
    ],
    columns: (rows) => [rows.map((r) => r.rss_mb), rows.map((r) => r.peak_rss_mb), rows.map((r) => r.peak_gpu_mb)],
  },
  {
    id: "chart-comm",
    title: "sent by rank 0 per step (MiB)",
    series: [{ label: "collectives MiB", color: PALETTE[7] }],
    columns: (rows) => [rows.map((r) => (r.comm_bytes ?? 0) / MiB)],
  },
];

// Step time of each rank, from the run's ranks.jsonl and then its ranks events (rows of
// columns by rank); with many ranks, the fastest, the median and the slowest.
const MAX_RANK_SERIES = 16;
class RankChart {
  constructor(parent, workers, sync) {
    this.workers = workers;
    this.each = workers <= MAX_RANK_SERIES;
    const series = this.each
      ? [...Array(workers).keys()].map((r) => ({ label: `rank ${r}`, color: PALETTE[r % PALETTE.length] }))
      : [
          { label: "fastest", color: PALETTE[2] },
          { label: "median", color: PALETTE[0] },
          { label: "slowest", color: PALETTE[1] },
        ];
    this.byStep = new Map();
    this.chart = new StepChart(parent, "step time by rank (s)", series, { id: "chart-ranks", sync, log: false });
  }

  add(row) {
    if (Array.isArray(row.step_seconds)) this.byStep.set(row.step, row.step_seconds);
  }

  draw(log) {
    this.chart.setLog(log);
    const steps = [...this.byStep.keys()].sort((a, b) => a - b);
    const columns = this.each
      ? [...Array(this.workers).keys()].map((r) => steps.map((s) => this.byStep.get(s)[r] ?? null))
      : [0, 0.5, 1].map((q) =>
          steps.map((s) => {
            const v = this.byStep.get(s).filter((x) => x !== null).sort((a, b) => a - b);
            return v[Math.round(q * (v.length - 1))];
          }),
        );
    this.chart.setData(steps, columns);
  }

  resize() {
    this.chart.resize();
  }

  destroy() {
    this.chart.destroy();
  }
}

function field(label, value, id) {
  return el("div", { class: "field" }, el("span", { class: "label" }, label), el("span", { class: "value", id }, value));
}

function summary(run) {
  const m = run.metrics || {};
  const where = run.scheduler
    ? `slurm job ${run.scheduler.slurm_job} ${run.scheduler.state || ""} ${run.scheduler.nodes || ""}`
    : Object.entries(run.pids || {})
        .map(([rank, pid]) => `${rank}:${pid}`)
        .join(" ");
  return [
    field("state", el("span", { class: `badge ${run.state}` }, run.state), "run-state"),
    field("step", `${run.last_step} / ${run.total_steps}`, "run-step"),
    field("ETA", duration(eta(run))),
    field("loss", num(m.loss), "run-loss"),
    field("validation", num(m.val_loss)),
    field("lr", num(m.lr), "run-lr"),
    field("tokens/s", num(m.tokens_per_second, 3)),
    field("MFU", m.mfu === undefined ? "–" : percent(m.mfu)),
    field("layout", layoutText(run.layout)),
    field("workers", `${run.workers}${where ? ` (${where})` : ""}`),
    field("restarts", `${run.restarts} of ${run.max_restarts}`),
    field("submitted", when(run.submitted)),
    run.error ? field("error", run.error) : null,
  ];
}

// A typed value from the field box: JSON where it parses (numbers, true, null), text otherwise.
function typed(text) {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

// Sends a control and shows the daemon's answer in `result` (and a toast).
async function sendControl(id, result, op, body, what) {
  try {
    const reply = await api.control(id, op, body);
    const text = `${what}: ${reply.accepted ? `accepted (${typeof reply.accepted === "string" ? reply.accepted : JSON.stringify(reply.accepted)})` : reply.state || reply.verify?.state || "done"}`;
    result.textContent = text;
    result.className = "result ok";
    toast(text);
  } catch (e) {
    result.textContent = `${what}: refused: ${e.message}`;
    result.className = "result refused";
    toast(result.textContent, true);
  }
}

function controls(id, result) {
  const act = (op, body, what) => sendControl(id, result, op, body, what);
  const lr = el("input", { id: "lr-input", type: "number", step: "any", placeholder: "new lr", size: 10 });
  const name = el("input", { id: "field-name", placeholder: "field (optimizer.grad_clip)", size: 22 });
  const value = el("input", { id: "field-value", placeholder: "value", size: 10 });
  const out = el("input", { id: "export-out", placeholder: "out (in the run dir)", size: 18 });
  const dtype = el("select", { id: "export-dtype" }, ["F32", "BF16", "F16"].map((d) => el("option", { value: d }, d)));
  const button = (label, bid, onclick, cls) => el("button", { id: bid, type: "button", onclick, class: cls }, label);
  return el(
    "section",
    { class: "controls" },
    el("h2", {}, "Controls"),
    el(
      "div",
      { class: "row" },
      button("Pause", "pause", () => act("pause", {}, "pause")),
      button("Resume", "resume", () => act("resume", {}, "resume")),
      button("Checkpoint now", "checkpoint", () => act("checkpoint", {}, "checkpoint")),
      button("Stop (checkpoint, end)", "stop", () => act("stop", {}, "stop")),
      button(
        "Cancel",
        "cancel",
        () => window.confirm(`Cancel ${id} without a checkpoint?`) && act("cancel", {}, "cancel"),
        "danger",
      ),
    ),
    el(
      "div",
      { class: "row" },
      lr,
      button("Set lr", "set-lr", () => act("set", { values: { "optimizer.lr": Number(lr.value) } }, `lr ${lr.value}`)),
      name,
      value,
      button("Set", "set-field", () => act("set", { values: { [name.value]: typed(value.value) } }, `${name.value} ${value.value}`)),
    ),
    el(
      "div",
      { class: "row" },
      out,
      dtype,
      button("Export (Hugging Face)", "export", () =>
        act("export", { ...(out.value ? { out: out.value } : {}), dtype: dtype.value }, "export"),
      ),
    ),
    result,
  );
}

function eventLine(kind, event) {
  const b = event.body || {};
  let text;
  if (kind === "state") text = `${b.previous} → ${b.state}${b.reason ? `: ${b.reason}` : ""}${b.error ? `: ${b.error}` : ""}`;
  else if (kind === "anomaly")
    text = `step ${b.step}: ${b.kind} (value ${num(b.value)}, score ${num(b.score)}) → ${b.action}${b.by ? ` by ${b.by}` : ""}`;
  else if (kind === "control")
    text = `${b.result} at step ${b.step}: ${b.values ? JSON.stringify(b.values) : b.error || ""}`;
  else if (kind === "checkpoint") text = b.ok ? `step ${b.step} saved: ${b.path}` : `step ${b.step} failed: ${b.error}`;
  else if (kind === "export" || kind === "verify") {
    const p = b.state === "running" && b.progress;
    const where = p ? `: ${p.stage} ${p.total > 0 ? Math.floor((100 * p.done) / p.total) : 100}%` : "";
    text = `${b.id} of step ${b.step} ${b.state}${where}${b.error ? `: ${b.error}` : ""}`;
  }
  else if (kind === "policy") text = `${b.policy} at step ${b.step}${b.error ? `: ${b.error}` : ""}`;
  else if (kind === "scheduler") text = `slurm job ${b.slurm_job} ${b.state}${b.reason ? ` (${b.reason})` : ""}`;
  else text = JSON.stringify(b);
  return el(
    "li",
    { class: `event ${kind}` },
    el("span", { class: "time" }, new Date(event.time * 1000).toLocaleTimeString()),
    el("span", { class: "kind" }, kind),
    text,
  );
}

// What the metrics rows record of a run's past (live changes, anomalies), for the events
// list of a page opened after they happened.
function historyLines(rows) {
  const lines = [];
  for (const r of rows) {
    const what = [];
    if (r.changes) what.push(`set ${Object.entries(r.changes).map(([k, v]) => `${k} = ${JSON.stringify(v)}`).join(", ")}`);
    if (r.anomaly) what.push(`${r.anomaly.kind} → ${r.anomaly.action}`);
    if (r.skipped) what.push("update skipped");
    if (what.length)
      lines.push(el("li", { class: `event ${r.anomaly ? "anomaly" : "control"}` }, el("span", { class: "kind" }, `step ${r.step}`), what.join("; ")));
  }
  return lines.reverse().slice(0, EVENT_LINES);
}

// A checkpoint's verification by this daemon: every file's size and hash against its
// manifest (a child process; the button asks for one).
function verdict(c) {
  const v = c.verify;
  if (c.error) return el("span", { class: "error-text" }, c.error);
  if (!v) return el("span", { class: "muted" }, "not verified");
  if (v.state === "running") return "verifying…";
  if (v.state === "done") return el("span", { class: "ok-text" }, `sound (${when(v.finished)})`);
  return el("span", { class: "error-text" }, v.error || "failed");
}

function verifyCell(c, onVerify) {
  const state = c.verify ? c.verify.state : "";
  return el("td", { class: "verify", "data-step": c.step, "data-state": state }, verdict(c), " ",
    el("button", { type: "button", class: "verify-button", disabled: state === "running", onclick: () => onVerify(c.step) }, "verify"));
}

function checkpointTable(list, onVerify) {
  if (!list.length) return el("p", { class: "muted" }, "No checkpoint yet.");
  return el(
    "table",
    { class: "checkpoints" },
    el("thead", {}, el("tr", {}, ["step", "size", "files", "layout", "tokens", "verified"].map((h) => el("th", {}, h)))),
    el(
      "tbody",
      {},
      list.map((c) =>
        el(
          "tr",
          {},
          el("td", { class: "num" }, c.step),
          el("td", { class: "num" }, c.error ? "–" : bytes(c.bytes)),
          el("td", { class: "num" }, c.files ?? "–"),
          el("td", {}, c.layout ? `${c.layout.dp}×${c.layout.tp}×${c.layout.pp} ZeRO-${c.layout.zero}` : "–"),
          el("td", { class: "num" }, c.tokens_seen ?? "–"),
          verifyCell(c, onVerify),
        ),
      ),
    ),
  );
}

export function mount(view, id) {
  const settings = viewSettings.get();
  const header = el("div", { class: "fields", id: "run-summary" });
  const result = el("p", { class: "result", id: "control-result" });
  const smoothing = el("input", { id: "smoothing", type: "range", min: 0, max: 0.99, step: 0.01, value: settings.smoothing });
  const smoothingText = el("span", { class: "muted" }, String(settings.smoothing));
  const log = el("input", { id: "log-scale", type: "checkbox", checked: settings.log });
  const grid = el("div", { class: "charts" });
  const events = el("ul", { class: "events", id: "events" });
  const checkpointBox = el("div", { id: "checkpoints" });
  const logBox = el("pre", { class: "log", id: "log" });
  const recipeBox = el("div", { id: "recipe" });
  view.append(
    el("div", { class: "toolbar" }, el("h1", {}, id), el("a", { href: `#/compare/${encodeURIComponent(id)}` }, "compare…")),
    header,
    controls(id, result),
    el(
      "div",
      { class: "toolbar" },
      el("label", {}, "smoothing ", smoothing, smoothingText),
      el("label", {}, log, " log scale"),
    ),
    grid,
    el("div", { class: "two" }, el("section", {}, el("h2", {}, "Events"), events), el("section", {}, el("h2", {}, "Checkpoints"), checkpointBox)),
    el("section", {}, el("h2", {}, "Log"), logBox),
    el("section", {}, el("h2", {}, "Recipe"), recipeBox),
  );
  const charts = CHARTS.map((c) => ({ spec: c, chart: new StepChart(grid, c.title, c.series, { log: settings.log, id: c.id, sync: `run-${id}` }) }));

  let run = null;
  let rankChart = null; // once the run's worker count is known, for more than one
  const rows = new Map(); // step → row: a rollback's steps replace the rows they repeat
  const drawCharts = () => {
    const ordered = [...rows.values()].sort((a, b) => a.step - b.step);
    const x = ordered.map((r) => r.step);
    for (const { spec, chart } of charts) {
      if (spec.more) chart.setSeries([...spec.series, ...spec.more(ordered)]);
      chart.setData(x, spec.columns(ordered, settings.smoothing));
    }
    if (rankChart) rankChart.draw(settings.log);
  };
  const drawSummary = () => run && append(clear(header), summary(run));
  const redraw = throttle(() => {
    drawCharts();
    drawSummary();
  }, 250);
  // Events can come in bursts (a job's progress, then its end): only the answer to the
  // newest request is drawn, whatever order the answers arrive in.
  let checkpointsAsked = 0;
  const loadCheckpoints = async () => {
    const asked = ++checkpointsAsked;
    try {
      const listed = await api.checkpoints(id);
      if (asked !== checkpointsAsked) return;
      append(
        clear(checkpointBox),
        checkpointTable(listed, (step) => sendControl(id, result, "verify", { step }, `verify step ${step}`)),
      );
    } catch (e) {
      if (asked === checkpointsAsked) checkpointBox.textContent = e.message;
    }
  };
  const reloadRun = throttle(async () => {
    try {
      run = await api.run(id);
      drawSummary();
    } catch (e) {
      toast(e.message, true);
    }
  }, 300);
  const addLog = (line) => {
    logBox.append(`${line}\n`);
    while (logBox.childNodes.length > LOG_LINES) logBox.firstChild.remove();
    logBox.scrollTop = logBox.scrollHeight;
  };

  smoothing.addEventListener("input", () => {
    settings.smoothing = Number(smoothing.value);
    smoothingText.textContent = smoothing.value;
    viewSettings.set(settings);
    drawCharts();
  });
  log.addEventListener("change", () => {
    settings.log = log.checked;
    viewSettings.set(settings);
    for (const { chart } of charts) chart.setLog(settings.log);
    drawCharts();
  });
  const onResize = throttle(() => {
    charts.forEach(({ chart }) => chart.resize());
    if (rankChart) rankChart.resize();
  }, 200);
  window.addEventListener("resize", onResize);

  // Subscribed first, so that nothing between the first read and the stream is lost;
  // rows are keyed by step, so one seen twice is drawn once.
  let loaded = false;
  const source = api.events(id, (kind, event) => {
    if (kind === "ranks") {
      if (rankChart) {
        rankChart.add(event.body);
        if (loaded) redraw();
      }
      return;
    }
    if (kind === "metrics") {
      rows.set(event.body.step, event.body);
      if (run) {
        run.metrics = event.body;
        run.last_step = event.body.step;
      }
      if (loaded) redraw();
      return;
    }
    if (kind === "log") return addLog(event.body.line);
    if (event.snapshot) return;
    events.prepend(eventLine(kind, event));
    while (events.childNodes.length > EVENT_LINES) events.lastChild.remove();
    if (kind === "state" || kind === "control" || kind === "scheduler") reloadRun();
    if (kind === "checkpoint" || kind === "verify") loadCheckpoints();
  });

  (async () => {
    try {
      run = await api.run(id);
      drawSummary();
      if (run.workers > 1) {
        rankChart = new RankChart(grid, run.workers, `run-${id}`);
        // A row the stream brought during the read is as new as the file's.
        for (const r of await api.metrics(id, "ranks")) if (!rankChart.byStep.has(r.step)) rankChart.add(r);
      }
      const past = await api.metrics(id);
      for (const r of past) if (!rows.has(r.step)) rows.set(r.step, r);
      events.append(...historyLines(past));
      loaded = true;
      drawCharts();
      for (const line of await api.logTail(id, 200)) addLog(line);
      loadCheckpoints();
      const r = await api.recipe(id);
      append(clear(recipeBox), [
        el("p", { class: "muted" }, `from ${r.source}; overrides: ${r.overrides.length ? r.overrides.join(", ") : "none"}; live changes: ${JSON.stringify(r.live)}`),
        el("pre", { class: "recipe" }, r.recipe),
      ]);
    } catch (e) {
      toast(`${id}: ${e.message}`, true);
    }
  })();

  return () => {
    source.close();
    window.removeEventListener("resize", onResize);
    charts.forEach(({ chart }) => chart.destroy());
    if (rankChart) rankChart.destroy();
  };
}
