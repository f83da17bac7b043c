"""Checkpoint cost, side by side in one run: tide's checkpoint write throughput against
the disk's own (dd writing the same number of random bytes with fsync, in the same
directory, as many files in a row as tide saved: this VM's disk writes a first file at
burst speed and the next ones several times slower, and zeros faster than data, so both
sides are taken in the same pattern),
tide's time counting from the snapshot to the commit,
and how long a save holds training up: synchronous (the whole write) versus
asynchronous (the snapshot to host memory), against the step time.
Usage: .venv/bin/python bench/checkpoint_io.py [--tide build/tools/tide] [--shape small|tiny] [--writers N]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import shapes
from shapes import SHAPES

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SAVED = re.compile(r"checkpoint: step (\d+) saved in \S+ \((\d+) bytes in ([0-9.]+) s")
HELD = re.compile(r"checkpoint: step (\d+) held training for ([0-9.]+) s")
STEP = re.compile(r'"step":(\d+).*?"step_seconds":([0-9.e+-]+)')


def train(tide, shape, data, work, async_save, steps, every, writers):
    run_dir = os.path.join(work, f"run-{'async' if async_save else 'sync'}")
    recipe = shapes.RECIPE
    overrides = shapes.overrides(shape, data, steps, checkpoint__every=every, checkpoint__keep_last=2,
                                 checkpoint__async="true" if async_save else "false", checkpoint__writers=writers)
    p = subprocess.run([tide, "train", recipe, "--run-dir", run_dir, "--quiet"] + overrides, check=True,
                       capture_output=True, text=True)
    saved = [(int(m[1]), int(m[2]), float(m[3])) for m in SAVED.finditer(p.stderr)]
    log = open(os.path.join(run_dir, "train.log")).read()
    held = {int(m[1]): float(m[2]) for m in HELD.finditer(log)}
    rows = open(os.path.join(run_dir, "metrics.jsonl")).read().splitlines()
    step_s = {}
    for r in rows:
        m = STEP.search(r)
        if m:
            step_s[int(m[1])] = float(m[2])
    shutil.rmtree(run_dir, ignore_errors=True)
    return saved, held, step_s


def dd(work, nbytes, times):
    """MB/s of dd writing nbytes with fsync, `times` files in a row (as the saves were).
    The bytes are random, read from a file in the page cache: this VM's disk writes
    zeros several times faster than data, so dd from /dev/zero would flatter it."""
    mb = max(1, nbytes // (1 << 20))
    source = os.path.join(work, "random.bin")
    with open(source, "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))
    rates = []
    for i in range(times):
        path = os.path.join(work, f"dd{i}.bin")
        t0 = time.perf_counter()
        subprocess.run(["dd", f"if={source}", f"of={path}", "bs=32M", "conv=fsync"], check=True, capture_output=True)
        rates.append(mb * (1 << 20) / (time.perf_counter() - t0) / 1e6)
    for i in range(times):
        os.remove(os.path.join(work, f"dd{i}.bin"))
    os.remove(source)
    return rates


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tide", default=os.path.join(ROOT, "build", "tools", "tide"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv"))
    ap.add_argument("--shape", default="small", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--writers", type=int, default=0, help="checkpoint.writers (0: tide's choice)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.data, "dataset.json")):
        sys.exit(f"bench: no dataset at {a.data}; run `make data` first")
    work = tempfile.mkdtemp(prefix="tide-ckpt-bench-", dir=os.path.join(ROOT, "build"))
    try:
        sync_saved, sync_held, sync_steps = train(a.tide, a.shape, a.data, work, False, a.steps, a.every, a.writers)
        async_saved, async_held, async_steps = train(a.tide, a.shape, a.data, work, True, a.steps, a.every, a.writers)
        nbytes = sync_saved[-1][1]
        disk_rates = dd(work, nbytes, len(sync_saved))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tide_mbs = [b / s / 1e6 for _, b, s in sync_saved]
    best, disk = statistics.median(tide_mbs), statistics.median(disk_rates)
    plain = [t for st, t in sync_steps.items() if st % a.every != 0 and st > 1]
    step = sum(plain) / len(plain) if plain else float("nan")
    sync_stall = sum(sync_held.values()) / len(sync_held)
    async_stall = sum(async_held.values()) / len(async_held)
    print(f"{a.shape} shape: a checkpoint is {nbytes / 1e6:.1f} MB (parameters and both AdamW moments, fp32), "
          f"checkpoint.writers={a.writers}, {os.cpu_count()} cores")
    print(f"  write throughput (median of {len(tide_mbs)} saves / dd runs in a row): tide {best:.0f} MB/s, "
          f"dd with fsync {disk:.0f} MB/s: {best / disk:.2f} x the disk")
    print(f"    tide {' '.join(f'{x:.0f}' for x in tide_mbs)}; dd {' '.join(f'{x:.0f}' for x in disk_rates)} MB/s")
    print(f"  training held per save: synchronous {sync_stall:.3f} s, asynchronous {async_stall:.3f} s "
          f"({sync_stall / max(async_stall, 1e-9):.0f} x less); a step takes {step:.2f} s")


if __name__ == "__main__":
    main()
