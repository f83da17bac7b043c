"""The planner against measurement: for every layout the suite trains (one process, dp
with ZeRO 0-3, offload, tp with and without sequence parallelism, pp with 1F1B, GPipe and
interleaved 1F1B, context parallelism, 2-D mixes, activation checkpointing on and off, bf16, a
mixture of experts with and without expert parallelism), `tide plan`
predicts rank 0's peak tensor memory and the step time; real runs of `tide train` measure
them (the counted host tensor bytes, the median of the steps after the first).

Prints, for each layout, memory predicted against measured and the step time measured
over predicted (after `tide plan --calibrate` on this machine), and the machine's speed
again at the end: a shared machine's speed wanders by a third within seconds (the steps
of one run measured from 1.3 to 1.8 s here), so the time column is a figure to read, not
a check. A run during which other processes kept cores busy says how many.

Memory is exact arithmetic, the same on a quiet machine and a loaded one: with
--check-memory a layout whose peak misses its prediction by more than 10% fails the run
(the test parallel.plan_memory; the tolerance covers what the model leaves out: Gloo's
and the allocator's own buffers, a few MiB of 100-220). That check runs CHECK_STEPS steps
a layout (every layout's peak is reached in its first step, the one that makes the
optimizer's state: the same figure after four, measured for each) and does not calibrate
again at the end.

Usage: .venv/bin/python bench/plan_vs_measured.py [--tide build/tools/tide] [--steps N]
       [--only TEXT] [--check-memory] [--table FILE]  (prints a Markdown table; FILE keeps it)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MEMORY_TOLERANCE = 0.10
# A layout whose steps the planner predicts to take longer than this in all runs its fewer
# steps (at least MIN_STEPS: the first, which is not timed, and three to take the median
# of; the memory check's CHECK_STEPS where it runs fewer), and if those would still not fit, micro-batches halved (the global batch
# with them: as many micro-batches a step) until they do or hold one sequence. On a CPU
# without bf16 instructions (an AVX2-only EPYC: bf16 products 35x slower than fp32's) a bf16
# step of micro-batch 8 takes 17 s: 4 steps of micro-batch 8 took 70 s each, 6 of
# micro-batch 2 about 30. The fp32 layouts' 8 steps take 7 to 13 s there.
RUN_BUDGET_SECONDS = 30
MIN_STEPS = 4
CHECK_STEPS = 2

# A LLaMA shape whose activations, logits and model state are all of the same order, so
# that an error in any of them shows: 3.4 M parameters, 37 MiB of saved tensors per block
# and micro-batch, a vocabulary of 4,096.
MODELS = {
    "llama": """tide.models.llama { vocab_size = 4096, dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 2,
                                 multiple_of = 64, max_seq_len = 256 }""",
    # GELU, LayerNorm, ALiBi, tied embeddings, biases.
    "bloom": """tide.models.bloom { vocab_size = 4096, dim = 256, n_layers = 4, n_heads = 4, max_seq_len = 256 }""",
    # A mixture of experts in every block (mixtral-tiny's form): 8 experts of width 256, 2 a
    # token. Its routing at the seed's initial weights is what the run measures; the planner
    # assumes it even.
    "moe": """tide.models.llama { vocab_size = 4096, dim = 256, n_layers = 4, n_heads = 4, n_kv_heads = 2,
                               ffn_dim = 256, moe_experts = 8, moe_top_k = 2, max_seq_len = 256 }""",
}
MICRO_BATCH, GLOBAL_BATCH, STEPS = 8, 16, 8
RECIPE = """
return tide.recipe {{
  name = "plan-check", seed = 3, threads = {threads},
  model = {model},
  data = {{ path = "{data}", seq_len = 256, prefetch = 2 }},
  batch = {{ micro_batch = {micro_batch}, global_batch = {global_batch} }},
  optimizer = {{ lr = 1e-3 }},
  schedule = {{ steps = {steps}, warmup_steps = 1 }},
  eval = {{ every = 0 }},
  checkpoint = {{ every = 0 }},
  log_every = 1,
}}
"""

# (name, processes, overrides[, model[, steps factor]]). The bf16 steps take a quarter to
# a half of fp32's: more of them keep the timed stretch as long as the others'.
LAYOUTS = [
    ("1 process", 1, []),
    ("BLOOM, 1 process", 1, [], "bloom"),
    ("BLOOM, tp2", 2, ["parallel.tp=2"], "bloom"),
    ("1 process, checkpointing", 1, ["model.activation_checkpointing=true"]),
    ("1 process, checkpointing 2 of 4 blocks", 1, ["model.activation_checkpointing=true", "model.recompute_blocks=2"]),
    ("dp2", 2, []),
    ("dp2 ZeRO-1", 2, ["parallel.zero=1"]),
    ("dp2 ZeRO-2", 2, ["parallel.zero=2"]),
    ("dp2 ZeRO-2, 2 micro-batches", 2, ["parallel.zero=2", "batch.global_batch=32"]),
    # One micro-batch of one sequence: the peak is no longer activations but the gradient
    # units' reduce-scatters at the end of backward (unit 0's beside two blocks', each with
    # the piece it returns and Gloo's copy of its input).
    ("dp2 ZeRO-2, micro-batch 1", 2, ["parallel.zero=2", "batch.micro_batch=1", "batch.global_batch=2"]),
    ("dp2 ZeRO-3", 2, ["parallel.zero=3"]),
    ("dp2 ZeRO-3, checkpointing", 2, ["parallel.zero=3", "model.activation_checkpointing=true"]),
    ("dp2 ZeRO-1 offload", 2, ["parallel.zero=1", "parallel.offload_optimizer=true"]),
    ("tp2", 2, ["parallel.tp=2"]),
    ("tp2 sequence parallel", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    ("pp2 1F1B x4", 2, ["parallel.pp=2", "batch.micro_batch=4"]),
    ("pp2 GPipe x4", 2, ["parallel.pp=2", "batch.micro_batch=4", "parallel.pipeline_schedule=gpipe"]),
    ("pp2 interleaved 1F1B x4", 2, ["parallel.pp=2", "batch.micro_batch=4", "parallel.virtual_stages=2"]),
    ("dp2 x tp2 ZeRO-1", 4, ["parallel.tp=2", "parallel.zero=1"]),
    # Context parallelism: half of each sequence a rank, beside every block's gathered keys
    # and values and the two chunks' masks (ALiBi's a row per head).
    ("cp2", 2, ["parallel.cp=2"]),
    ("BLOOM, cp2", 2, ["parallel.cp=2"], "bloom"),
    ("cp2 all-to-all", 2, ["parallel.cp=2", "parallel.cp_comm=all_to_all"]),
    ("BLOOM, cp2 all-to-all", 2, ["parallel.cp=2", "parallel.cp_comm=all_to_all"], "bloom"),
    ("dp2 x cp2 ZeRO-2, checkpointing", 4, ["parallel.cp=2", "parallel.zero=2", "model.activation_checkpointing=true"]),
    # bf16: one micro-batch casts each weight again in backward (no copies kept), ZeRO-3 too.
    # Their time holds since the calibration measures fused attention's own rate (on this
    # project's EPYC its bf16 kernel runs 1.1x its fp32 one, the GEMMs 4x) and the bf16
    # model's own matmul rate.
    ("1 process, bf16", 1, ["precision.compute=bf16", "batch.global_batch=8"], "llama", 3),
    ("dp2 ZeRO-3, bf16", 2, ["parallel.zero=3", "precision.compute=bf16"], "llama", 2),
    # A mixture of experts: the routed copies of each token and the experts' activations;
    # under expert parallelism half the experts a rank, in flat buffers of their own.
    ("MoE, 1 process", 1, [], "moe"),
    ("MoE, checkpointing", 1, ["model.activation_checkpointing=true"], "moe"),
    ("MoE, dp2 ep2", 2, ["parallel.ep=2"], "moe"),
    ("MoE, dp2 ep2 ZeRO-3, bf16", 2, ["parallel.ep=2", "parallel.zero=3", "precision.compute=bf16"], "moe", 2),
    ("MoE, tp2", 2, ["parallel.tp=2"], "moe"),
    # A gated shared expert of 512 beside the routed ones (Qwen2-MoE's form), in bf16.
    ("MoE with a shared expert, bf16", 1, ["model.moe_shared_ffn_dim=512", "model.moe_shared_gate=true",
                                           "precision.compute=bf16", "batch.global_batch=8"], "moe", 2),
    # The planner assumes even routing; the runs above route as the seed's initial router
    # does (under ep2 rank 0 received 0.74 to 1.44 of its even share of a block's rows:
    # their memory comes out 6-7% above the prediction). With every expert chosen for every
    # token the routing is even, and the arithmetic shows alone.
    ("MoE every expert a token, dp2 ep2", 2, ["parallel.ep=2", "model.moe_top_k=8", "batch.micro_batch=4",
                                              "batch.global_batch=8"], "moe"),
]


def busy_cpu_seconds():
    """Seconds of CPU time every process of the machine has used (all cores, /proc/stat),
    and those of this process's finished children."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    t = os.times()
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), t.children_user + t.children_system


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")
    return p.stdout


def setting(fields, name, default):
    return next((int(f.split("=")[1]) for f in fields if f.startswith(name + "=")), default)


def replace(fields, values):
    return [f for f in fields if f.split("=")[0] not in values] + [f"{k}={v}" for k, v in values.items()]


def as_sets(fields):
    return [a for f in fields for a in ("--set", f)]


class Bench:
    def __init__(self, tide, work, calibration):
        self.tide, self.work = tide, work
        self.calibration = calibration or f"{work}/calibration.json"

    def prepare_data(self):
        texts = [f for f in ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0")
                 if os.path.exists(f)]
        run([self.tide, "data", "prepare", *texts, "--out", f"{self.work}/ds", "--vocab-size", "4096",
             "--val-fraction", "0.05"])

    def calibrate(self, path=None):
        """Measures the machine into `path`, by default the calibration the plans read
        (unless that file exists already)."""
        if path is None and os.path.exists(self.calibration):
            print(f"this machine as {self.calibration} measured it", flush=True)
            return
        print(run([self.tide, "plan", "--calibrate", "--calibration", path or self.calibration]).strip(), flush=True)

    def predict(self, name, nproc, recipe, fields):
        plan = json.loads(run([self.tide, "plan", recipe, "--nproc", str(nproc), "--calibration", self.calibration,
                               "--json", "--top", "1", *as_sets(fields)]))
        own = plan["recipe_layout"]
        if "memory" not in own:
            raise SystemExit(f"FAIL: {name}: the planner cannot evaluate the layout: {own}")
        return own

    def fit_budget(self, name, nproc, recipe, fields, steps):
        """The layout's fields with micro-batches and steps cut to the run budget, and the
        planner's view of it."""
        own = self.predict(name, nproc, recipe, fields)
        micro = setting(fields, "batch.micro_batch", MICRO_BATCH)
        batch = setting(fields, "batch.global_batch", GLOBAL_BATCH)
        fewest = min(steps, MIN_STEPS)
        while fewest * own["time"]["step"] > RUN_BUDGET_SECONDS and micro > 1:
            micro, batch = micro // 2, batch // 2
            fields = replace(fields, {"batch.micro_batch": micro, "batch.global_batch": batch})
            own = self.predict(name, nproc, recipe, fields)
        if steps * own["time"]["step"] > RUN_BUDGET_SECONDS:
            steps = max(fewest, int(RUN_BUDGET_SECONDS / own["time"]["step"]))
        return replace(fields, {"schedule.steps": steps}), own

    def measure(self, index, name, nproc, recipe, fields):
        run_dir = f"{self.work}/run-{index}"
        shutil.rmtree(run_dir, ignore_errors=True)
        machine_before, ours_before = busy_cpu_seconds()
        wall_before = time.monotonic()
        run([self.tide, "train", recipe, "--nproc", str(nproc), "--run-dir", run_dir, "--quiet", *as_sets(fields)])
        machine, ours = busy_cpu_seconds()
        # Cores other processes kept busy, on average over the run.
        outside = max(0.0, (machine - machine_before) - (ours - ours_before)) / (time.monotonic() - wall_before)
        metrics = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
        shutil.rmtree(run_dir, ignore_errors=True)
        # The peak is the run's so far: the last step's holds every step's.
        return (metrics[-1]["peak_host_tensor_mb"], statistics.median(r["step_seconds"] for r in metrics[1:]),
                outside)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tide", default="build/tools/tide")
    ap.add_argument("--steps", type=int,
                    help=f"steps a layout runs (default {STEPS}, the bf16 layouts 2-3 times as many; "
                         f"with --check-memory {CHECK_STEPS})")
    ap.add_argument("--only", help="the layouts whose name contains this text (default: all)")
    ap.add_argument("--check-memory", action="store_true",
                    help=f"fail when a layout's peak memory misses its prediction by more than "
                         f"{100 * MEMORY_TOLERANCE:.0f}%%")
    ap.add_argument("--calibration",
                    help="the CPU's calibration to plan with: read where the file exists, else measured into it "
                         "(default: measured afresh into a scratch file)")
    ap.add_argument("--table", help="also write the Markdown table to this file")
    args = ap.parse_args()
    if args.steps is None:
        args.steps = CHECK_STEPS if args.check_memory else STEPS
    if args.steps < 2:
        ap.error(f"--steps {args.steps}: at least 2 (the first step is not timed)")
    work = tempfile.mkdtemp(prefix="tide-plan-")
    bench = Bench(args.tide, work, args.calibration)
    bench.prepare_data()
    bench.calibrate()
    chosen = [(i, layout) for i, layout in enumerate(LAYOUTS) if not args.only or args.only in layout[0]]
    if not chosen:
        ap.error(f"--only {args.only!r}: no layout's name contains it")
    cores = len(os.sched_getaffinity(0))
    rows, failures = [], []
    for index, (name, nproc, overrides, *rest) in chosen:
        started = time.monotonic()
        model = rest[0] if rest else "llama"
        factor = rest[1] if len(rest) > 1 and not args.check_memory else 1
        recipe = f"{work}/recipe-{model}-{nproc}.lua"
        with open(recipe, "w") as f:
            f.write(RECIPE.format(data=f"{work}/ds", threads=max(1, cores // nproc), model=MODELS[model],
                                  micro_batch=MICRO_BATCH, global_batch=GLOBAL_BATCH, steps=args.steps))
        fields, own = bench.fit_budget(name, nproc, recipe, overrides, args.steps * factor)
        measured_mb, measured_s, outside = bench.measure(index, name, nproc, recipe, fields)
        predicted_mb, predicted_s = own["memory"]["by_stage"][0] / 2**20, own["time"]["step"]
        mem_err = predicted_mb / measured_mb - 1
        note = f" (other processes kept {outside:.2f} cores busy)" if outside > 0.25 else ""
        rows.append((name, own["layout"]["describe"], predicted_mb, measured_mb, mem_err, predicted_s, measured_s,
                     note))
        print(f"[{len(rows)}/{len(chosen)}] {name}: memory {100 * mem_err:+.1f}%, step {measured_s:.3f} s, "
              f"{measured_s / predicted_s:.2f}x predicted{note}, {time.monotonic() - started:.0f} s", flush=True)
        if abs(mem_err) > MEMORY_TOLERANCE:
            failures.append(f"{name}: memory predicted {predicted_mb:.1f} MiB, measured {measured_mb:.1f} MiB "
                            f"({100 * mem_err:+.1f}%)")
    if not args.check_memory:
        print("the machine again, after the runs:")
        bench.calibrate(f"{work}/after.json")

    lines = ["| layout | planner's name | memory predicted (MiB) | measured | error | step predicted (s) | "
             "measured | measured / predicted |",
             "|---|---|---|---|---|---|---|---|"]
    for name, desc, pm, mm, me, ps, ms, note in rows:
        lines.append(f"| {name} | {desc} | {pm:.1f} | {mm:.1f} | {100 * me:+.1f}% | {ps:.3f} | {ms:.3f} | "
                     f"{ms / ps:.2f}x{note} |")
    table = "\n".join(lines)
    print(table)
    if args.table:
        os.makedirs(os.path.dirname(os.path.abspath(args.table)), exist_ok=True)
        with open(args.table, "w") as f:
            f.write(table + "\n")
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("memory off its prediction:\n  " + "\n  ".join(failures), file=sys.stderr)
        if args.check_memory:
            raise SystemExit(1)
    print("plan vs measured: memory " + ("ok" if not failures else "MISSED"))


if __name__ == "__main__":
    main()
