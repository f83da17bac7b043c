// tided's HTTP API (docs/dashboard.md): reads, controls with the dashboard token, and the
// event stream. The token stays in this browser's localStorage for this origin only.

const TOKEN_KEY = "tide.dashboard.token";
const EVENT_KINDS = ["state", "metrics", "ranks", "control", "checkpoint", "export", "verify", "log", "anomaly", "scheduler", "policy"];

export const token = {
  get: () => localStorage.getItem(TOKEN_KEY) || "",
  set: (value) => (value ? localStorage.setItem(TOKEN_KEY, value) : localStorage.removeItem(TOKEN_KEY)),
};

async function reply(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    throw new Error(`${response.status} ${response.statusText}`);
  }
  if (!response.ok) throw new Error(body?.error?.message || `${response.status} ${response.statusText}`);
  return body;
}

const runPath = (run) => `/api/runs/${encodeURIComponent(run)}`;

export async function get(path) {
  return reply(await fetch(path, { cache: "no-store" }));
}

export const runs = async () => (await get("/api/runs")).runs;
export const run = async (id) => (await get(runPath(id))).run;
export const info = () => get("/api/info");
export const checkpoints = async (id) => (await get(`${runPath(id)}/checkpoints`)).checkpoints;
export const logTail = async (id, lines) => (await get(`${runPath(id)}/logs?lines=${lines}`)).lines;
export const recipe = (id) => get(`${runPath(id)}/recipe`);

// Every row of a run's metrics.jsonl ("train") or ranks.jsonl ("ranks"), in pages of
// the protocol's largest size.
export async function metrics(id, source = "train") {
  const page = 100000;
  const rows = [];
  for (let since = 0; ; ) {
    const got = (await get(`${runPath(id)}/metrics?source=${source}&since_step=${since}&limit=${page}`)).metrics;
    rows.push(...got);
    if (got.length < page) return rows;
    since = got[got.length - 1].step;
  }
}

// A control (pause, resume, stop, checkpoint, cancel, set, export), as the CLI sends it.
export async function control(id, op, body = {}) {
  return reply(
    await fetch(`${runPath(id)}/${op}`, {
      method: "POST",
      headers: { Authorization: `Bearer ${token.get()}`, "Content-Type": "application/json" },
      body: JSON.stringify(body),
    }),
  );
}

// The events of one run (or of all with no id), as server-sent events: onEvent(kind, event).
// EventSource reconnects by itself; the caller closes it when its page goes.
export function events(id, onEvent) {
  const source = new EventSource(id ? `/api/events?run=${encodeURIComponent(id)}` : "/api/events");
  for (const kind of EVENT_KINDS)
    source.addEventListener(kind, (e) => {
      let event;
      try {
        event = JSON.parse(e.data);
      } catch {
        return;
      }
      onEvent(kind, event);
    });
  return source;
}
