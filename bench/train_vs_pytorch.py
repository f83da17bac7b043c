"""Trains the same LLaMA shape through tide and through PyTorch, side by side.

Prints tokens/s of each and their ratio, peak memory, and MFU against the matmul peak of
the precision measured here. In fp32 PyTorch runs eager as installed (glibc malloc), eager
with its best allocator settings (jemalloc preloaded with the options tide uses; CPU only),
and torch.compile (inductor; the warm-up steps take the compilation). With --precision bf16
(tide's precision.compute = "bf16") the peers are eager fp32, eager bf16 autocast, the
same with F.scaled_dot_product_attention and AdamW(fused=True), and that under
torch.compile. --shape window trains with a sliding window of an eighth of the sequence and
adds the peer that passes the window's mask to F.scaled_dot_product_attention. --shape moe
trains mixtral-tiny's shape (8 experts of 256 a block, 2 a token) against transformers'
Mixtral block written into the peer; MFU counts the router and the 2 experts a token uses.
--lora R
trains LoRA adapters of rank R (lora_alpha 16) on every block projection, the rest frozen:
tide with model.lora_rank = R, each peer through PEFT (inject_adapter_in_model); MFU then
counts 4 FLOPs a frozen matmul weight a token (no weight gradient) and 6 an adapter's.
Usage: .venv/bin/python bench/train_vs_pytorch.py --tide build/tools/tide [--shape tiny|small|window|all]
       .venv/bin/python bench/train_vs_pytorch.py --device cuda --precision bf16 --shape s1   (also s2, gpu)
       add --profile-dir DIR for tide's profile of two steps after the timed ones (docs/profiling.md)
"""
import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
import shapes  # noqa: E402  (bench/ is the script directory)
from shapes import SHAPES  # noqa: E402
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
JEMALLOC_CONF = "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1,background_thread:false"


def matmul_peak(threads, device, dtype):
    torch.set_num_threads(threads)
    best = 0.0
    for n in ((1024, 2048) if device == "cpu" else (4096, 8192)):
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        c = a @ b
        for _ in range(3):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            if device == "cuda":
                torch.cuda.synchronize()
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def counted_keys(s):
    """The keys a query is counted against (tide's train/flops.h): the sequence, or for a
    window w shorter than it that scaled as the keys the window leaves causal attention."""
    t, w = s["seq"], s.get("window", 0)
    if not w or w >= t:
        return t
    return t * (w * (w + 1) / 2 + (t - w) * w) / (t * (t + 1) / 2)


def flops_per_token(s, ffn, lora=0):
    d, kv_rows = s["dim"], s.get("kv", s["heads"]) * (s["dim"] // s["heads"])
    # A mixture of experts: the router and the top k experts a token passes through.
    mlp = s["top_k"] * 3 * d * s["expert_ffn"] + s["experts"] * d if s.get("experts") else 3 * d * ffn
    matmul_params = s["layers"] * (2 * d * d + 2 * d * kv_rows + mlp) + s["vocab"] * d
    attention = 12 * s["layers"] * s["dim"] * counted_keys(s)
    if not lora:
        return 6 * matmul_params + attention
    # rank (in + out) a projection: q and o (d, d), k and v (d, kv_rows), gate, up and down (d, ffn)
    adapters = s["layers"] * lora * (4 * d + 2 * (d + kv_rows) + 3 * (d + ffn))
    return 4 * matmul_params + 6 * adapters + attention


def run_tide(tide, s, steps, warmup, threads, data, device, precision, lora=0, cuda_graphs=True, profile_to=None):
    """profile_to: a directory that gets the profile (docs/profiling.md) of two more steps
    after the timed ones, which the figures leave out."""
    run_dir = tempfile.mkdtemp(prefix="tide-bench-")
    # The run's last step also writes its final checkpoint (every weight copied to the
    # host): it is neither timed nor profiled (two profiled steps come before it).
    extra = 3 if profile_to else 1
    recipe = os.path.join(ROOT, "recipes", "llama", "llama-tiny.lua")
    sets = {
        "model.vocab_size": s["vocab"], "model.dim": s["dim"], "model.n_layers": s["layers"],
        "model.n_heads": s["heads"], "model.n_kv_heads": s.get("kv", 0), "model.multiple_of": 256,
        "model.max_seq_len": s["seq"], "model.sliding_window": s.get("window", 0), "data.seq_len": s["seq"],
        "data.path": data, "batch.micro_batch": s["batch"], "batch.global_batch": s["batch"],
        "schedule.steps": warmup + steps + extra, "schedule.warmup_steps": 0, "eval.every": 0,
        "optimizer.lr": 3e-4, "optimizer.beta2": 0.95, "threads": threads, "log_every": 1000,
        "device": device, "precision.compute": precision, "cuda_graphs": str(cuda_graphs).lower(),
        "model.lora_rank": lora,
    }
    sets.update(shapes.expert_sets(s))
    if profile_to:
        # With the inputs' shapes: the trace then says which operator, on what, launched
        # each kernel (a copy's source, say).
        sets.update({"profile.start_step": warmup + steps + 1, "profile.steps": 2, "profile.shapes": "true"})
    cmd = [tide, "train", recipe, "--run-dir", run_dir, "--quiet"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    timed = rows[warmup:warmup + steps]
    if profile_to:
        shutil.copytree(os.path.join(run_dir, "profile"), profile_to, dirs_exist_ok=True)
    secs = sum(r["step_seconds"] for r in timed)
    out = {"tokens_per_second": s["batch"] * s["seq"] * len(timed) / secs,
           "peak_rss_mb": max(r["peak_rss_mb"] for r in rows), "final_loss": rows[-1]["loss"],
           "peak_device_mb": max(r.get("peak_gpu_mb") or 0 for r in rows) if device == "cuda" else None}
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def run_torch(s, steps, warmup, threads, data, jemalloc, device, lora=0, compile=False, flags=()):
    env = dict(os.environ)
    if jemalloc:
        env["LD_PRELOAD"] = JEMALLOC
        env["MALLOC_CONF"] = JEMALLOC_CONF
    cmd = [sys.executable, os.path.join(HERE, "pytorch_llama.py"), "--data", os.path.join(data, "train.bin"),
           "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads), "--device", device]
    for k in ("dim", "layers", "heads", "vocab", "seq", "batch"):
        cmd += [f"--{k}", str(s[k])]
    cmd += ["--kv-heads", str(s.get("kv", 0)), "--window", str(s.get("window", 0)), "--lora", str(lora), *flags]
    if s.get("experts"):
        cmd += ["--experts", str(s["experts"]), "--top-k", str(s["top_k"]), "--expert-ffn", str(s["expert_ffn"])]
    if compile:
        cmd.append("--compile")
    res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tide", default=os.path.join(ROOT, "build", "tools", "tide"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv"))
    ap.add_argument("--shape", default="all", choices=["tiny", "small", "gpu", "s1", "s2", "window", "moe", "all"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: both on GPU 0 (tide with device=cuda)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="tide's precision.compute; bf16 changes the peers to bf16 autocast ones")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK",
                    help="LoRA adapters of this rank (tide's model.lora_rank, PEFT in the peers); 0: full training")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default: 30 tiny, 8 small)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--profile-dir", help="tide's profile of two steps after the timed ones (a trace and a summary "
                    "per shape, docs/profiling.md) is copied here; on CUDA also that of the run with "
                    "cuda_graphs = false, as SHAPE-uncaptured")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.data, "dataset.json")):
        sys.exit(f"bench: no dataset at {a.data}; run `make data` first")

    bf16 = a.precision == "bf16"
    peak = matmul_peak(a.threads, a.device, torch.bfloat16 if bf16 else torch.float32)
    where = f"{a.threads} threads" if a.device == "cpu" else torch.cuda.get_device_name(0)
    print(f"PyTorch {torch.__version__}; {a.precision} matmul peak (torch.mm, {where}): {peak / 1e9:.1f} GFLOP/s")
    shapes = ["tiny", "small"] if a.shape == "all" else [a.shape]
    # On CUDA tide captures its step after 3 steps and replays it from the 4th: the steps
    # timed start after the capture.
    warmup = max(a.warmup, 5) if a.device == "cuda" else a.warmup
    failed = False
    for name in shapes:
        s = SHAPES[name]
        steps = a.steps or (30 if name == "tiny" else 8)
        ffn = 256 * ((int(2 * 4 * s["dim"] / 3) + 255) // 256)
        fpt = flops_per_token(s, ffn, a.lora)
        window = f", window {s['window']}" if s.get("window") else ""
        if s.get("experts"):
            window += f", {s['experts']} experts of {s['expert_ffn']} ({s['top_k']} a token)"
        print(f"\n{name}: dim {s['dim']}, {s['layers']} layers, {s['heads']} heads ({s.get('kv', s['heads'])} kv), "
              f"vocab {s['vocab']}, seq {s['seq']}{window}, batch {s['batch']}; {steps} timed steps after {warmup}, "
              f"{a.precision}" + (f", LoRA rank {a.lora}" if a.lora else ""))
        peer = functools.partial(run_torch, s, steps, warmup, a.threads, a.data, device=a.device, lora=a.lora)
        tide = functools.partial(run_tide, a.tide, s, steps, warmup, a.threads, a.data, a.device, a.precision,
                                 lora=a.lora)
        profile_to = os.path.join(a.profile_dir, name) if a.profile_dir else None
        memory = "GPU MB" if a.device == "cuda" else "peak MB"

        def row(k, r, base):
            tps = r["tokens_per_second"]
            mb = r["peak_device_mb"] if a.device == "cuda" else r["peak_rss_mb"]
            ratio = f"{base / tps:8.2f}" if base else f"{'':8s}"
            return f"  {k:32s} {tps:10.0f} {ratio} {100 * tps * fpt / peak:6.1f}% {mb or 0:9.0f}"

        # Each figure is printed as it is measured, and a run that fails is reported with the
        # end of its stderr and the others still run: a short lease of a GPU machine keeps
        # whatever it reached.
        results = {}

        def measure(k, fn, *args, **kwargs):
            try:
                results[k] = fn(*args, **kwargs)
                print(row(k, results[k], None), flush=True)
            except subprocess.CalledProcessError as e:
                print(f"  {k}: failed ({e.returncode}): {(e.stderr or '')[-2000:]}", flush=True)

        measure("tide", tide, profile_to=profile_to)
        if profile_to:
            print(f"  tide's profile of two more steps: {profile_to}")
        if a.device == "cuda":
            # Profiled too: the two profiles side by side say what a replay costs or saves.
            measure("tide, cuda_graphs = false", tide, cuda_graphs=False,
                    profile_to=profile_to + "-uncaptured" if profile_to else None)
        if bf16:
            # The peers the acceptance names come first.
            best = ("--bf16", "--sdpa", "--fused-adamw")
            measure("eager bf16 + SDPA + fused AdamW", peer, False, flags=best)
            measure("the same, torch.compile", peer, False, compile=True, flags=best)
            measure("pytorch eager bf16", peer, False, flags=("--bf16",))
            measure("pytorch eager fp32", peer, False)
        else:
            measure("pytorch eager", peer, False)
            if s.get("window"):
                measure("eager + SDPA, the window's mask", peer, False, flags=("--sdpa",))
            if a.device == "cpu":
                measure("pytorch eager + jemalloc", peer, True)
            measure("pytorch torch.compile", peer, False, compile=True)
        if "tide" not in results:
            failed = True
            continue
        base = results["tide"]["tokens_per_second"]
        print(f"  {'':32s} {'tokens/s':>10s} {'tide x':>8s} {'MFU':>7s} {memory:>9s}")
        for k, r in results.items():
            print(row(k, r, base))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
