"""Parallel layouts side by side on one machine: one process vs data parallel vs ZeRO-1
(and ZeRO-1 with optimizer offload), same model, same global batch.

Prints tokens/s (and the ratio to one process), bytes each rank sent per step against
the theoretical minimum (one ring all-reduce of the fp32 gradients, 8 psi (N-1)/N),
model-state bytes per rank against fp32 AdamW theory, and peak resident memory per rank.
On a 2-core machine the absolute speed-up is bounded; the communication and memory
ratios are the point.
Usage: /usr/bin/python3 bench/parallel_layouts.py [--tide build/tools/tide] [--shape small|tiny]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPES = {
    "tiny": dict(dim=256, layers=4, heads=4, vocab=8192, seq=256, batch=8),
    "small": dict(dim=512, layers=8, heads=8, vocab=32000, seq=512, batch=4),
}
LAYOUTS = [
    ("1 process", 1, {}),
    ("dp2", 2, {}),
    ("ZeRO-1 x2", 2, {"parallel.zero": 1}),
    ("ZeRO-1 x2 + offload", 2, {"parallel.zero": 1, "parallel.offload_optimizer": "true"}),
]


def run(tide, shape, nproc, extra, steps, warmup, data):
    s = SHAPES[shape]
    run_dir = tempfile.mkdtemp(prefix="tide-layout-")
    sets = {
        "model.vocab_size": s["vocab"], "model.dim": s["dim"], "model.n_layers": s["layers"],
        "model.n_heads": s["heads"], "model.n_kv_heads": 0, "model.multiple_of": 256,
        "model.max_seq_len": s["seq"], "data.seq_len": s["seq"], "data.path": data,
        "batch.micro_batch": s["batch"] // nproc if s["batch"] % nproc == 0 else s["batch"],
        "batch.global_batch": s["batch"], "schedule.steps": warmup + steps, "schedule.warmup_steps": 0,
        "eval.every": 0, "log_every": 1000,
    }
    sets.update(extra)
    recipe = os.path.join(ROOT, "recipes", "llama", "llama-tiny.lua")
    overrides = [arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")]
    launch = ["--nproc", str(nproc)] if nproc > 1 else []
    subprocess.run([tide, "train", recipe, "--run-dir", run_dir, "--quiet"] + launch + overrides, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    shown = subprocess.run([tide, "recipe", "show", recipe] + overrides, check=True, capture_output=True, text=True)
    psi = json.loads(shown.stdout)["model"]["parameters"]
    shutil.rmtree(run_dir, ignore_errors=True)
    timed = rows[warmup:]
    tps = s["batch"] * s["seq"] * len(timed) / sum(r["step_seconds"] for r in timed)
    return dict(tps=tps, comm=timed[-1]["comm_bytes"], state=sum(timed[-1]["model_state_bytes"].values()),
                peak=max(r["peak_rss_mb"] for r in rows), psi=psi)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tide", default=os.path.join(ROOT, "build", "tools", "tide"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv"))
    ap.add_argument("--shape", default="small", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.data, "dataset.json")):
        sys.exit(f"bench: no dataset at {a.data}; run `make data` first")
    print(f"{a.shape} shape, {a.steps} timed steps after {a.warmup}; global batch {SHAPES[a.shape]['batch']}")
    print(f"  {'layout':22s} {'tokens/s':>9s} {'vs 1':>6s} {'sent/step MB':>13s} {'x min':>6s} "
          f"{'state MB':>9s} {'x theory':>8s} {'peak MB':>8s}")
    base = None
    for name, nproc, extra in LAYOUTS:
        r = run(a.tide, a.shape, nproc, extra, a.steps, a.warmup, a.data)
        base = base or r["tps"]
        psi = r["psi"]
        comm_min = 8 * psi * (nproc - 1) / nproc
        zero = int(extra.get("parallel.zero", 0))
        theory = 16 * psi if zero == 0 else 8 * psi + 8 * psi / nproc
        ratio = f"{r['comm'] / comm_min:6.3f}" if comm_min else f"{'-':>6s}"
        print(f"  {name:22s} {r['tps']:9.0f} {r['tps'] / base:6.2f} {r['comm'] / 1e6:13.1f} {ratio} "
              f"{r['state'] / 1e6:9.1f} {r['state'] / theory:8.3f} {r['peak']:8.0f}")


if __name__ == "__main__":
    main()
