"""Parallel layouts side by side on one machine, same model, same global batch: one
process, data parallel, ZeRO-1/2/3 (and ZeRO-3 with optimizer offload), tensor parallel
(with and without sequence parallelism), pipeline parallel (1F1B, and interleaved over
two chunks per stage) and context parallel, each on 2 ranks; with --shape moe, expert
parallel (ep2, and with ZeRO-1) instead of context and sequence parallel.

Prints tokens/s (and the ratio to one process); the bytes rank 0 sent per step against
the layout's theoretical volume (psi parameters, N ranks, a micro-batches per rank,
S = 4 B T D bytes of one micro-batch's activations, L blocks):
  dp, ZeRO-1   8 psi (N-1)/N            (one ring all-reduce of the gradients)
  ZeRO-2       (a+1) 4 psi (N-1)/N      (a reduce-scatters, one all-gather)
  ZeRO-3       a 4 (3 psi - E - H - B) (N-1)/N  (gather for forward, again for backward
                                         except the embedding E, the last block B and the
                                         head H with the final norm, reduce-scatter)
  tp           a (4L + 2) 2 S (N-1)/N   (two all-reduces per block forward and backward,
                                         embedding and head; sequence parallel: the same
                                         bytes as all-gathers and reduce-scatters, plus
                                         a 2L S (N-1)/N: each block's two norms' outputs
                                         gathered again in backward)
  pp (stage 0) a (2V - 1) S             (its activations to the next stage, V chunks; with
                                         V > 1 also V - 1 chunks' input gradients back)
  cp           8 psi (N-1)/N + a L 3 KV (N-1)/N  (the gradients' all-reduce over the cp
                                         ranks, and per block the keys' and values' gather
                                         forward, again in backward, and their gradients'
                                         reduce-scatter, KV = 4 B T 2 K Hd bytes of one
                                         micro-batch's keys and values: LLaMA's causal
                                         attention, unmasked_context_attention)
  ep           8 (psi - psi_e) (N-1)/N + a L 4 k B T D 4 (N-1)/N  (the dense gradients'
                                         all-reduce, and per block the routed rows (k a
                                         token) out and back, forward and backward, if
                                         routing is uniform; psi_e: the experts' parameters)
  cp all-to-all 8 psi (N-1)/N + a L 2 X (N-1)/N  (per block q, k, v and the output
                                         exchanged forward, their gradients backward,
                                         X = 4 B (T/N) (2 H + 2 K') Hd, K' = K where N
                                         divides it, else N)
model-state bytes per rank against fp32 AdamW theory where it is simple (dp, ZeRO), and
peak resident memory of rank 0. On a 2-core machine the absolute speed-up is bounded; the
communication and memory ratios are the point.
Usage: .venv/bin/python bench/parallel_layouts.py [--tide build/tools/tide] [--shape small|tiny|long]
                                                  [--only "1 process" cp2 ...]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import shapes
from shapes import SHAPES

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LAYOUTS = [
    ("1 process", 1, {}),
    ("dp2", 2, {}),
    ("ZeRO-1 x2", 2, {"parallel.zero": 1}),
    ("ZeRO-2 x2", 2, {"parallel.zero": 2}),
    ("ZeRO-3 x2", 2, {"parallel.zero": 3}),
    ("ZeRO-3 x2 + offload", 2, {"parallel.zero": 3, "parallel.offload_optimizer": "true"}),
    ("tp2", 2, {"parallel.tp": 2}),
    ("tp2 + sequence par.", 2, {"parallel.tp": 2, "parallel.sequence_parallel": "true"}),
    ("pp2 (1f1b)", 2, {"parallel.pp": 2}),
    ("pp2 interleaved (v2)", 2, {"parallel.pp": 2, "parallel.virtual_stages": 2}),
    ("cp2", 2, {"parallel.cp": 2}),
    ("cp2 all-to-all", 2, {"parallel.cp": 2, "parallel.cp_comm": "all_to_all"}),
    # Mixture-of-experts shapes only (--shape moe): the experts spread over the ranks.
    ("ep2", 2, {"parallel.ep": 2}),
    ("ep2 + ZeRO-1", 2, {"parallel.ep": 2, "parallel.zero": 1}),
]


def runs_on(shape, extra):
    """Whether the layout applies to the shape: expert parallelism needs experts, and a
    mixture of experts runs neither context nor sequence parallelism."""
    experts = bool(SHAPES[shape].get("experts"))
    if "parallel.ep" in extra:
        return experts
    return not experts or ("parallel.cp" not in extra and "parallel.sequence_parallel" not in extra)


def run(tide, shape, nproc, extra, steps, warmup, data):
    s = SHAPES[shape]
    run_dir = tempfile.mkdtemp(prefix="tide-layout-")
    extra = dict(extra)
    extra.setdefault("parallel.micro_batches", 0)
    micro = s["batch"] // nproc if s["batch"] % nproc == 0 else s["batch"]
    overrides = shapes.overrides(shape, data, warmup + steps, batch__micro_batch=micro,
                                 **{k.replace(".", "__"): v for k, v in extra.items()})
    recipe = shapes.RECIPE
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
    ap.add_argument("--only", nargs="+", metavar="LAYOUT", choices=[name for name, _, _ in LAYOUTS],
                    help="run only these layouts (the first is the one the others are compared with)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.data, "dataset.json")):
        sys.exit(f"bench: no dataset at {a.data}; run `make data` first")
    print(f"{a.shape} shape, {a.steps} timed steps after {a.warmup}; global batch {SHAPES[a.shape]['batch']}")
    print(f"  {'layout':22s} {'tokens/s':>9s} {'vs 1':>6s} {'sent/step MB':>13s} {'x vol':>6s} "
          f"{'state MB':>9s} {'x theory':>8s} {'peak MB':>8s}")
    base = None
    sh = SHAPES[a.shape]
    chosen = [layout for layout in LAYOUTS if (not a.only or layout[0] in a.only) and runs_on(a.shape, layout[2])]
    for name, nproc, extra in chosen:
        tp, pp = int(extra.get("parallel.tp", 1)), int(extra.get("parallel.pp", 1))
        cp = int(extra.get("parallel.cp", 1))
        if pp > 1:  # a pipeline needs micro-batches to overlap its stages
            extra = dict(extra, **{"parallel.micro_batches": 2})
        r = run(a.tide, a.shape, nproc, extra, a.steps, a.warmup, a.data)
        base = base or r["tps"]
        psi, n = r["psi"], nproc
        dp = n // (tp * pp * cp)
        micro = sh["batch"] // n if sh["batch"] % n == 0 else sh["batch"]  # as run() sets it
        if pp > 1:
            micro = sh["batch"] // (2 * dp)
        micro_batches = sh["batch"] // (micro * dp)
        zero = int(extra.get("parallel.zero", 0))
        ep = int(extra.get("parallel.ep", 1))
        outer = 2 * sh["vocab"] * sh["dim"] + sh["dim"]  # E + H: embedding, head, final norm
        block = (psi - outer) / sh["layers"]
        act = 4 * micro * sh["seq"] * sh["dim"]
        # The experts' share of psi, which ep spreads: each rank holds psi_e / ep of them.
        psi_e = sh["layers"] * sh["experts"] * 3 * sh["dim"] * sh["expert_ffn"] if sh.get("experts") else 0
        if n == 1:
            volume = 0
        elif ep > 1:
            # The dense parameters' gradients (the experts' have no other holder here), and
            # per block and micro-batch k rows a token out and back, forward and backward,
            # (N-1)/N of them to other ranks where routing is uniform (the measure shows
            # how far it is not).
            rows = micro_batches * sh["layers"] * 4 * sh["top_k"] * micro * sh["seq"]
            volume = 8 * (psi - psi_e) * (n - 1) / n + rows * 4 * sh["dim"] * (n - 1) / n
        elif tp > 1:
            volume = micro_batches * (4 * sh["layers"] + 2) * 2 * act * (tp - 1) / tp
            if extra.get("parallel.sequence_parallel") == "true":
                volume += micro_batches * 2 * sh["layers"] * act * (tp - 1) / tp
        elif cp > 1 and extra.get("parallel.cp_comm") == "all_to_all":
            heads, kv_heads = sh["heads"], sh.get("kv") or sh["heads"]
            received = kv_heads if kv_heads % n == 0 else n
            exchanged = 4 * micro * sh["seq"] // n * (2 * heads + 2 * received) * (sh["dim"] // heads)
            volume = 8 * psi * (n - 1) / n + micro_batches * sh["layers"] * 2 * exchanged * (n - 1) / n
        elif cp > 1:
            kv = 4 * micro * sh["seq"] * 2 * (sh.get("kv") or sh["heads"]) * (sh["dim"] // sh["heads"])
            volume = 8 * psi * (n - 1) / n + micro_batches * sh["layers"] * 3 * kv * (n - 1) / n
        elif pp > 1:
            v = int(extra.get("parallel.virtual_stages", 1))
            volume = micro_batches * (2 * v - 1) * act
        elif zero == 3:
            volume = micro_batches * 4 * (3 * psi - outer - block) * (n - 1) / n
        elif zero == 2:
            volume = (micro_batches + 1) * 4 * psi * (n - 1) / n
        else:
            volume = 8 * psi * (n - 1) / n
        offload = extra.get("parallel.offload_optimizer") == "true"
        theory = None
        if tp == 1 and pp == 1:
            dense, held = psi - psi_e * (ep > 1), psi_e / ep * (ep > 1)  # the experts alone, unshared
            theory = [16 * dense, 8 * dense + 8 * dense / n, 4 * dense + 12 * dense / n, 16 * dense / n][zero] + 16 * held
            if offload:
                theory += 8 * psi / n  # the host master copy and gradient staging
        ratio = f"{r['comm'] / volume:6.3f}" if volume else f"{'-':>6s}"
        state_ratio = f"{r['state'] / theory:8.3f}" if theory else f"{'-':>8s}"
        print(f"  {name:22s} {r['tps']:9.0f} {r['tps'] / base:6.2f} {r['comm'] / 1e6:13.1f} {ratio} "
              f"{r['state'] / 1e6:9.1f} {state_ratio} {r['peak']:8.0f}", flush=True)


if __name__ == "__main__":
    main()
