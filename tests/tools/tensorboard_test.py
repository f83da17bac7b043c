"""A run's TensorBoard event files, read back by TensorBoard's own event reader.

tide train writes <run>/tb/ beside metrics.jsonl. The test trains 8 steps (checkpoints at
4 and 8, an evaluation at 4 and 8), removes the step-8 checkpoint and resumes: the second
attempt rewrites steps 5-8 in a second file. TensorBoard's EventAccumulator must then
hold each step once, with the values of metrics.jsonl as float32 (the format's
simple_value): the loss, learning rate, gradient norm and validation loss, exactly.

Usage: tensorboard_test.py TIDE
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TIDE = sys.argv[1]
WORK = tempfile.mkdtemp(prefix="tide-tb-test-")
# The C API tests' tiny recipe, made short: checkpoints and evaluations at steps 4 and 8.
RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "capi", "tiny.lua")
SHORT = ["--set", "schedule.steps=8", "--set", "checkpoint.every=4", "--set", "checkpoint.keep_last=10",
         "--set", "checkpoint.async=false", "--set", "eval.every=4", "--set", "eval.batches=2"]


def train(*extra):
    subprocess.run([TIDE, "train", RECIPE, "--run-dir", "run", "--quiet", *SHORT, *extra], cwd=WORK, check=True)


try:
    subprocess.run([TIDE, "data", "prepare", "/usr/share/common-licenses/GPL-3", "--out", os.path.join(WORK, "ds"),
                    "--tokenizer", "bytes", "--val-fraction", "0.1"], check=True, stderr=subprocess.DEVNULL)
    run = os.path.join(WORK, "run")
    train()
    shutil.rmtree(os.path.join(run, "checkpoints", "step-00000008"))
    train("--resume", "auto")
    files = sorted(os.listdir(os.path.join(run, "tb")))
    assert len(files) == 2 and all(f.startswith("events.out.tfevents.") for f in files), files

    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(1, 9)), [r["step"] for r in rows]
    acc = EventAccumulator(os.path.join(run, "tb"))
    acc.Reload()
    for tag, field in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                       ("eval/loss", "val_loss")):
        events = acc.Scalars(tag)
        want = [(r["step"], np.float32(r[field])) for r in rows if field in r]
        got = [(e.step, np.float32(e.value)) for e in events]
        assert got == want, f"{tag}: TensorBoard has {got}, metrics.jsonl {want}"
    # Wall time: the row's time, a double in both (the event's wall_time is a double).
    walls = [(e.step, e.wall_time) for e in acc.Scalars("train/loss")]
    assert walls == [(r["step"], r["time"]) for r in rows], (walls, [r["time"] for r in rows])
    assert all(a["time"] < b["time"] for a, b in zip(rows, rows[1:]))
    print(f"TensorBoard reads {len(files)} event files: steps 1-8 once each (5-8 from the resumed attempt), "
          f"loss, lr, grad_norm and eval/loss equal to metrics.jsonl as float32; tags {sorted(acc.Tags()['scalars'])}")
finally:
    shutil.rmtree(WORK, ignore_errors=True)
