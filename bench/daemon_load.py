"""tided under load, against tided idle, while a run trains.

Part "requests": thousands of status requests, a subscriber that never reads, open
dashboards (server-sent event streams, read as a browser reads them) and a Prometheus
scrape every second, for the whole of one run, against the same run trained before and
after with the daemon idle. Prints the request and scrape latency percentiles and the
training speed of both, as a ratio.

Part "dashboards": what issue 19 asks of the dashboard alone. One run trains through
alternating phases: idle, then the run's dashboard page open in headless Chromium
(bench/browser_page.py), N more event streams and /metrics scraped each second, then idle,
... (starting and ending idle, so that each loaded phase is compared with the idle phases
either side of it and the machine's drift cancels). Prints the median step time of every
phase, the loaded/idle speed ratios, how long after a step ended its metrics event reached
the streams and the page showed it (the step's `time` against the reader's clock: one
host).

Usage: .venv/bin/python bench/daemon_load.py [--part requests|dashboards|all] [--steps 300]
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
from tided_client import Conn, Tided, wait_status  # noqa: E402

RECIPE = """return tide.recipe {
  name = "load", seed = 7, threads = 1,
  model = tide.models.llama { vocab_size = 300, dim = 128, n_layers = 4, n_heads = 4, multiple_of = 64,
                              max_seq_len = 128 },
  data = { path = "ds", seq_len = 128 },
  batch = { micro_batch = 4, global_batch = 4 },
  schedule = { steps = %d, warmup_steps = 2 },
  eval = { every = 0 },
  log_every = 100000,
}
"""


class Dashboard(threading.Thread):
    """A browser's dashboard page: one event stream of the run, read as it comes. For each
    metrics event, how long after its step ended it arrived."""

    def __init__(self, url, run):
        super().__init__(daemon=True)
        host, port = url[len("http://"):].rstrip("/").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.conn.request("GET", f"/api/events?run={run}")
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.status
        self.events = 0
        self.delays = []  # step end to the stream; of which, to tided's publishing it:
        self.to_daemon = []

    def run(self):
        kind = None
        try:
            for line in self.response:
                if line.startswith(b"event: "):
                    self.events += 1
                    kind = line[len(b"event: "):].strip()
                elif line.startswith(b"data: ") and kind == b"metrics":
                    event = json.loads(line[len(b"data: "):])
                    if not event.get("snapshot") and "time" in event["body"]:
                        self.delays.append(time.time() - event["body"]["time"])
                        self.to_daemon.append(event["time"] - event["body"]["time"])
        except (OSError, ValueError, AttributeError):  # closed at the end (http.client drops its file)
            pass

    def close(self):
        self.conn.close()
        self.join(5)


class Scraper(threading.Thread):
    """Prometheus: GET /metrics once a second."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.latencies, self.stop = url + "metrics", [], threading.Event()

    def run(self):
        import urllib.request
        while not self.stop.wait(1.0):
            s = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=10) as r:
                r.read()
            self.latencies.append(time.perf_counter() - s)


def ms(values):
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return f"p50 {q[49] * 1e3:.2f} ms, p90 {q[89] * 1e3:.2f} ms, p99 {q[98] * 1e3:.2f} ms, max {max(values) * 1e3:.2f} ms"


def median_step_seconds(conn, run):
    rows = conn.request("metrics", {"run": run, "limit": 100000})["metrics"]
    return statistics.median(r["step_seconds"] for r in rows[5:])


def requests_part(a, d, conn, work):
    body = {"recipe": RECIPE % a.steps, "workdir": work}

    def idle_run():
        run = conn.request("submit", body)["run"]["id"]
        wait_status(conn, run, lambda r: r["state"] == "completed", timeout=900, what="end")
        return median_step_seconds(conn, run)

    idle_steps = [idle_run()]

    # A subscriber to everything that never reads, with small buffers.
    ctx = zmq.Context()
    deaf = ctx.socket(zmq.SUB)
    deaf.setsockopt(zmq.RCVHWM, 10)
    deaf.setsockopt(zmq.RCVBUF, 4096)
    deaf.setsockopt_string(zmq.SUBSCRIBE, "")
    deaf.connect(d.tcp("events"))

    loaded = conn.request("submit", body)["run"]["id"]
    wait_status(conn, loaded, lambda r: r["state"] == "running" and r["last_step"] >= 10, what="running")
    client = Conn(d.tcp("commands"), ctx=ctx)
    pages = [Dashboard(d.endpoints["http"], loaded) for _ in range(a.dashboards)]
    scraper = Scraper(d.endpoints["http"])
    for t in pages + [scraper]:
        t.start()
    # Status requests at --rate for as long as the run trains.
    latencies = []
    t0 = time.perf_counter()
    while True:
        if a.rate > 0:
            ahead = t0 + len(latencies) / a.rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
        s = time.perf_counter()
        r = client.request("status", {"run": loaded})["run"]
        latencies.append(time.perf_counter() - s)
        if r["state"] != "running":
            break
    load_seconds = time.perf_counter() - t0
    scraper.stop.set()
    scraper.join()
    wait_status(conn, loaded, lambda r: r["state"] == "completed", timeout=900, what="end")
    for page in pages:
        page.close()
    loaded_step = median_step_seconds(conn, loaded)
    idle_steps.append(idle_run())  # idle before and after: the machine's drift
    idle_step = statistics.mean(idle_steps)
    deaf.close(0)
    client.close()

    pace = f"paced at {a.rate:.0f}/s" if a.rate > 0 else "back to back"
    print(f"[requests] {len(latencies)} status requests in {load_seconds:.1f} s "
          f"({len(latencies) / load_seconds:.0f}/s, {pace}) on one connection, for the whole of a {a.steps}-step run")
    print(f"[requests] latency: {ms(latencies)}")
    print(f"[requests] {a.dashboards} dashboard streams received {[p.events for p in pages]} events; "
          f"{len(scraper.latencies)} scrapes of /metrics: {ms(scraper.latencies)}")
    print(f"[requests] median step: idle daemon {idle_step * 1e3:.1f} ms (runs before and after: "
          f"{idle_steps[0] * 1e3:.1f}, {idle_steps[1] * 1e3:.1f}), under load {loaded_step * 1e3:.1f} ms; "
          f"training speed under load / idle = {idle_step / loaded_step:.3f} "
          f"(a subscriber that never read was connected throughout)")


class BrowserPage:
    """The run's dashboard page in headless Chromium (bench/browser_page.py): open once
    `ready` returns; `close` gives each step the page displayed and when."""

    def __init__(self, url, run):
        self.proc = subprocess.Popen(["/usr/bin/python3", os.path.join(ROOT, "bench", "browser_page.py"),
                                      f"{url}#/run/{run}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ready(self):
        line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            raise SystemExit(f"the browser page did not open: {line!r} (exit {self.proc.wait()})")

    def close(self):
        self.proc.stdin.close()
        shown = json.loads(self.proc.stdout.readline())
        self.proc.wait(60)
        return shown


def dashboards_part(a, d, conn, work):
    run = conn.request("submit", {"recipe": RECIPE % 10_000_000, "workdir": work})["run"]["id"]
    wait_status(conn, run, lambda r: r["state"] == "running" and r["last_step"] >= 10, what="running")
    phases = []  # (loaded, start, end): Unix seconds, the clock of the steps' `time`
    delays, to_daemon, events, scrapes, shown = [], [], [], [], []
    for i in range(2 * a.pairs + 1):
        loaded = i % 2 == 1
        browsers = []
        if loaded:
            # Chromium's start is not part of having a page open: the phase begins once
            # every page shows the run.
            browsers = [BrowserPage(d.endpoints["http"], run) for _ in range(a.browsers)]
            for b in browsers:
                b.ready()
        start = time.time()
        if loaded:
            pages = [Dashboard(d.endpoints["http"], run) for _ in range(a.dashboards)]
            scraper = Scraper(d.endpoints["http"])
            for t in pages + [scraper]:
                t.start()
        time.sleep(a.phase_seconds)
        if loaded:
            scraper.stop.set()
            scraper.join()
            for page in pages:
                page.close()
                delays += page.delays
                to_daemon += page.to_daemon
                events.append(page.events)
            scrapes += scraper.latencies
        end = time.time()
        for b in browsers:
            shown += [(t, step) for t, step in b.close() if start <= t <= end]
        phases.append((loaded, start, end))
    conn.request("cancel", {"run": run})
    wait_status(conn, run, lambda r: r["state"] == "cancelled", timeout=120, what="cancelled")
    rows = conn.request("metrics", {"run": run, "limit": 100000})["metrics"]

    # A phase's steps: those that began and ended inside it (the first second of each is
    # left out: streams opening or closing).
    def median_of(phase):
        _, start, end = phase
        inside = [r["step_seconds"] for r in rows if start + 1 <= r["time"] - r["step_seconds"] and r["time"] <= end]
        return statistics.median(inside), len(inside)

    medians = [median_of(p) for p in phases]
    print(f"[dashboards] one run, {len(phases)} phases of {a.phase_seconds:.0f} s: idle, then {a.browsers} "
          f"dashboard page(s) open in headless Chromium, {a.dashboards} more event streams read as a page reads "
          f"them, and /metrics scraped each second, then idle, ...")
    for (loaded, _, _), (m, n) in zip(phases, medians):
        print(f"[dashboards]   {'loaded' if loaded else 'idle  '}: median step {m * 1e3:.2f} ms over {n} steps")
    ratios = []
    for i in range(1, len(phases), 2):
        idle = (medians[i - 1][0] + medians[i + 1][0]) / 2
        ratios.append(idle / medians[i][0])
    print(f"[dashboards] training speed loaded / idle (each loaded phase against the idle ones either side): "
          f"{', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    print(f"[dashboards] {sum(events)} events to {len(events)} streams; step end to its metrics event at a stream: "
          f"{ms(delays)} ({len(delays)} events, {sum(x > 1 for x in delays)} later than 1 s); of which from the "
          f"step's end to tided publishing it: {ms(to_daemon)}")
    print(f"[dashboards] {len(scrapes)} scrapes of /metrics: {ms(scrapes)}")
    if shown:
        ended = {r["step"]: r["time"] for r in rows}
        page_delays = [t - ended[step] for t, step in shown if step in ended]
        print(f"[dashboards] the browser pages showed {len(page_delays)} new steps (the page redraws at most "
              f"4 times a second, so it skips steps); step end to the step shown: {ms(page_delays)}, "
              f"{sum(x > 1 for x in page_delays)} later than 1 s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tide", default=os.path.join(ROOT, "build", "tools", "tide"))
    ap.add_argument("--tided", default=os.path.join(ROOT, "build", "tools", "tided"))
    ap.add_argument("--part", choices=["requests", "dashboards", "all"], default="all")
    ap.add_argument("--steps", type=int, default=300, help="steps of each run of the requests part")
    ap.add_argument("--dashboards", type=int, default=2, help="open dashboard pages (event streams; tided allows 8)")
    ap.add_argument("--rate", type=float, default=1000,
                    help="status requests per second (0: back to back; on 2 cores the client and the daemon "
                         "then take a core from training)")
    ap.add_argument("--browsers", type=int, default=1,
                    help="run pages open in headless Chromium in the dashboards part's loaded phases")
    ap.add_argument("--pairs", type=int, default=4, help="loaded phases of the dashboards part")
    ap.add_argument("--phase-seconds", type=float, default=20, help="length of each phase of the dashboards part")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tided-load-")
    try:
        subprocess.run([a.tide, "data", "prepare", "/usr/share/common-licenses/GPL-3",
                        "/usr/share/common-licenses/Apache-2.0", "--out", os.path.join(work, "ds"),
                        "--tokenizer", "bytes", "--val-fraction", "0.1"], check=True, stderr=subprocess.DEVNULL)
        # The daemon starts tide-worker (beside tide); a build from before it existed ran tide.
        worker = os.path.join(os.path.dirname(a.tide), "tide-worker")
        d = Tided(a.tided, worker if os.path.exists(worker) else a.tide, os.path.join(work, "state"), slots=1).start()
        conn = Conn(d.tcp("commands"))
        if a.part in ("requests", "all"):
            requests_part(a, d, conn, work)
        if a.part in ("dashboards", "all"):
            dashboards_part(a, d, conn, work)
        d.stop()
    finally:
        subprocess.run(["pkill", "-KILL", "-f", work], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
