#!/usr/bin/env bash
# Data parallelism and ZeRO with real worker processes on CPU (Gloo over loopback):
#  - dp2 and ZeRO-1/2/3 x2 reproduce one process's losses (relative 1e-5) and final
#    parameters (1e-5), for a LLaMA shape (GQA) and a BLOOM shape (ALiBi, tied);
#  - ZeRO-1 equals plain dp exactly, and so does ZeRO-2 with one micro-batch per rank
#    (with more, ZeRO-2 reduces every micro-batch, as DeepSpeed does: the sums run in
#    another order, so only rounding differs); optimizer offload changes no bit;
#  - per-rank model-state bytes equal the fp32 AdamW theory on 2 and 4 ranks, and the
#    bytes sent equal each stage's theoretical volume;
#  - bf16 ZeRO-3 x2, LLaMA and BLOOM (gathered and held in bf16, saved in fp32), and
#    fp16 ZeRO-2 x2 (with its loss scale) agree with one process in the same dtype to its
#    resolution;
#  - a data blend of two datasets under ZeRO-2 x2 reproduces one process's losses and
#    each dataset's validation loss;
#  - data.eod_mask_loss under ZeRO-2 x2: the step's loss is the mean over all its counted
#    targets, whatever each rank's micro-batches hold, as in one process; likewise
#    data.loss_mask with data.document_windows on prompt-completion examples;
#  - a worker killed with SIGKILL stops the job within 60 s, named by rank.
source "$(dirname "$0")/common.sh" "$1"

for shape in llama bloom; do
  echo "$shape:"
  train $shape $shape-1
  train $shape $shape-dp2 --nproc 2
  for z in 1 2 3; do
    train $shape $shape-zero$z --nproc 2 --set parallel.zero=$z
    compare "$work/$shape-1" "$work/$shape-zero$z" 0 || fail "$shape: ZeRO-$z differs from one process"
  done
  compare "$work/$shape-1" "$work/$shape-dp2" 0 || fail "$shape: dp2 differs from one process"
  compare "$work/$shape-dp2" "$work/$shape-zero1" 1 || fail "$shape: ZeRO-1 differs from plain dp"
  cmp -s "$work/$shape-dp2/model.safetensors" "$work/$shape-zero1/model.safetensors" || fail "$shape: ZeRO-1 weights are not dp's bytes"
  # One micro-batch per rank: ZeRO-2 reduces exactly what plain dp reduces.
  train $shape $shape-dp2-g4 --nproc 2 --set batch.global_batch=4
  train $shape $shape-zero2-g4 --nproc 2 --set batch.global_batch=4 --set parallel.zero=2
  compare "$work/$shape-dp2-g4" "$work/$shape-zero2-g4" 1 || fail "$shape: ZeRO-2 differs from plain dp"
  cmp -s "$work/$shape-dp2-g4/model.safetensors" "$work/$shape-zero2-g4/model.safetensors" \
    || fail "$shape: ZeRO-2 weights are not dp's bytes"
done

# bf16 under ZeRO-3: units are gathered and held in bf16 (half the bytes: checked with the
# volumes and the gathered peak below), so the products multiply by the weights one
# process casts, and what is read otherwise (embeddings, norm weights; BLOOM's biases,
# embedding norm and tied head, which casts the fp32 embedding) by its rounding.
train llama llama-bf16-1 --set precision.compute=bf16
train llama llama-bf16-zero3 --nproc 2 --set parallel.zero=3 --set precision.compute=bf16
compare_half "$work/llama-bf16-1" "$work/llama-bf16-zero3" 8 || fail "bf16 ZeRO-3 differs from one process"
train bloom bloom-bf16-1 --set precision.compute=bf16
train bloom bloom-bf16-zero3 --nproc 2 --set parallel.zero=3 --set precision.compute=bf16
compare_half "$work/bloom-bf16-1" "$work/bloom-bf16-zero3" 8 || fail "BLOOM bf16 ZeRO-3 differs from one process"
# What it saves is gathered in fp32: the weights are not rounded to bf16 (a weight AdamW
# moved has low mantissa bits, one rounded to bf16 has none).
/usr/bin/python3 - "$work/llama-bf16-zero3/model.safetensors" <<'PY' || fail "bf16 ZeRO-3 saved rounded weights"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
words = [w for name, e in header.items() if name != "__metadata__" and len(e["shape"]) == 2
         for w in struct.unpack_from(f"<{(e['data_offsets'][1] - e['data_offsets'][0]) // 4}I", raw, 8 + n + e["data_offsets"][0])]
low = sum(1 for w in words if w & 0xFFFF) / len(words)
print(f"  bf16 ZeRO-3 saved {len(words)} matrix weights, {low:.1%} with low mantissa bits")
assert low > 0.9, low
PY
# fp16 under ZeRO-2: the scaled gradients reduce-scattered as backward makes them, the
# scale divided out in the update of each rank's pieces.
train llama llama-fp16-1 --set precision.compute=fp16
train llama llama-fp16-zero2 --nproc 2 --set parallel.zero=2 --set precision.compute=fp16
compare_half "$work/llama-fp16-1" "$work/llama-fp16-zero2" 11 || fail "fp16 ZeRO-2 differs from one process"

# A data blend: the ranks together draw the samples one process draws from each dataset,
# and validate each dataset alike.
cp /usr/share/common-licenses/GPL-2 /usr/share/common-licenses/LGPL-2.1 "$work/"
$tide data prepare "$work/GPL-2" "$work/LGPL-2.1" --out "$work/ds2" --tokenizer bytes --val-fraction 0.1 2> /dev/null
blend=(--set data.path= --set "data.blend=[{\"path\": \"$work/ds\", \"weight\": 3}, {\"path\": \"$work/ds2\"}]")
train llama llama-blend-1 "${blend[@]}"
train llama llama-blend-zero2 --nproc 2 --set parallel.zero=2 "${blend[@]}"
compare "$work/llama-blend-1" "$work/llama-blend-zero2" 0 || fail "a blend under ZeRO-2 differs from one process"
/usr/bin/python3 - "$work" <<'PY' || fail "a blend's validation losses differ between layouts"
import json, sys
rows = {run: [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")] for run in ("llama-blend-1", "llama-blend-zero2", "llama-1")}
evaluated = [r for r in rows["llama-blend-1"] if "val_loss" in r]
assert [r["step"] for r in evaluated] == [5, 10], evaluated
for a, b in zip(evaluated, [r for r in rows["llama-blend-zero2"] if "val_loss" in r]):
    assert sorted(a["val_losses"]) == ["ds", "ds2"], a
    for name, loss in a["val_losses"].items():
        assert abs(b["val_losses"][name] - loss) <= 1e-5 * loss, (a["step"], name, loss, b["val_losses"][name])
    assert abs(a["val_loss"] - (0.75 * a["val_losses"]["ds"] + 0.25 * a["val_losses"]["ds2"])) <= 1e-12 * a["val_loss"]
# The blend trains on other samples than the first dataset alone.
assert [r["loss"] for r in rows["llama-blend-1"]] != [r["loss"] for r in rows["llama-1"]]
print(f"  blend 3:1 of two datasets: ZeRO-2 x2 matches one process; validation at step 10: {evaluated[-1]['val_losses']}")
PY

# data.eod_mask_loss: each rank's micro-batches hold their own counts of document ends;
# each micro-batch weighs as its counted targets among the step's, summed over the ranks
# before backward, so ZeRO-2 x2 gives one process's losses, validation and weights (a
# rank-local mean would weigh a target of a rank with more ends more).
echo "eod mask loss:"
train llama llama-eod-1 --set data.eod_mask_loss=true
train llama llama-eod-zero2 --nproc 2 --set parallel.zero=2 --set data.eod_mask_loss=true
compare "$work/llama-eod-1" "$work/llama-eod-zero2" 0 || fail "ZeRO-2 x2 with data.eod_mask_loss differs from one process"
losses_differ "$work/llama-1" "$work/llama-eod-1" || fail "data.eod_mask_loss changed nothing"

# data.loss_mask with data.document_windows on prompt-completion examples: the prompts
# left out of the loss, every window starting at an example. Each rank's windows and
# counted targets are its share of one process's, so ZeRO-2 x2 gives its losses and weights.
echo "loss mask:"
/usr/bin/python3 - "$work/sft.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(400):
        f.write(json.dumps({"prompt": f"Example {i}. Q: {'why ' * (i % 7)}?\n",
                            "completion": f"A: {'because ' * (1 + i % 9)}{i}."}) + "\n")
PY
$tide data prepare "$work/sft.jsonl" --format prompt-completion --out "$work/sft" --tokenizer bytes --val-fraction 0.1 2> /dev/null
sft=(--set "data.path=$work/sft" --set data.loss_mask=true --set data.document_windows=true)
train llama llama-sft-1 "${sft[@]}"
train llama llama-sft-zero2 --nproc 2 --set parallel.zero=2 "${sft[@]}"
compare "$work/llama-sft-1" "$work/llama-sft-zero2" 0 || fail "ZeRO-2 x2 with data.loss_mask differs from one process"

# Optimizer offload (master pieces and moments in host memory) changes no bit.
train llama llama-offload --nproc 2 --set parallel.zero=1 --set parallel.offload_optimizer=true
compare "$work/llama-dp2" "$work/llama-offload" 1 || fail "ZeRO-1 offload differs from plain dp"
train llama llama-zero3-offload --nproc 2 --set parallel.zero=3 --set parallel.offload_optimizer=true
compare "$work/llama-zero3" "$work/llama-zero3-offload" 1 || fail "ZeRO-3 offload differs from ZeRO-3"
cmp -s "$work/llama-zero3/model.safetensors" "$work/llama-zero3-offload/model.safetensors" \
  || fail "ZeRO-3 offload weights are not ZeRO-3's bytes"
# ZeRO-3 gathers each block again inside activation checkpointing's recomputation.
train bloom bloom-zero3-recompute --nproc 2 --set parallel.zero=3 --set model.activation_checkpointing=true
compare "$work/bloom-zero3" "$work/bloom-zero3-recompute" 1 || fail "ZeRO-3 with recomputation differs"

# Model-state bytes per rank against fp32 AdamW theory (psi parameters, N ranks), and
# bytes sent per step against each stage's volume (S: the units padded to N):
#   dp   16 psi                 all-reduce                  8 S (N-1)/N
#   ZeRO-1  8 psi +  8 psi / N  reduce-scatter + all-gather 8 S (N-1)/N
#   ZeRO-2  4 psi + 12 psi / N  a reduce-scatters + all-gather (a + 1) 4 S (N-1)/N
#   ZeRO-3 16 psi / N           a x (gather for forward, again for backward but the embeddings
#                               (unit 0), the last block and the head, reduce-scatter)
#                                                       a 4 (3 S - U_0 - B_last - H) (N-1)/N
#          bf16 compute: the gathers in bf16            a (2 (2 S - U_0 - B_last - H) + 4 S) (N-1)/N
# with a micro-batches per rank and step. The test LLaMA is untied: its final norm and head
# are a unit of their own (parameter_names.h), after the blocks.
for z in 0 1 2 3; do
  train llama llama-x4-zero$z --nproc 4 --set parallel.zero=$z --set schedule.steps=2 --set eval.every=0
done
/usr/bin/python3 - "$work" "$(dirname "$0")" <<'PY' || fail "model-state bytes or bytes sent differ from the theory"
import json, sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from units import unit_sizes, widened
units = unit_sizes(f"{work}/llama-1/model.safetensors")
psi = sum(units.values())
micro, global_batch = 2, 8
cases = [("llama-dp2", 0, 2, 4), ("llama-zero1", 1, 2, 4), ("llama-zero2", 2, 2, 4), ("llama-zero3", 3, 2, 4)]
cases += [(f"llama-x4-zero{z}", z, 4, 4) for z in range(4)]
cases += [("llama-bf16-zero3", 3, 2, 2)]
for run, zero, n, width in cases:  # width: bytes of a gathered ZeRO-3 element
    padded = {u: -(-k // n) * n for u, k in units.items()}
    s = sum(padded.values())
    a = global_batch // (micro * n)
    theory = [16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n][zero]
    last_block = max(u for u in padded if u != "head")
    zero3 = a * (width * (2 * s - padded[0] - padded[last_block] - padded["head"]) + 4 * s)
    volume = [8 * s, 8 * s, (a + 1) * 4 * s, zero3][zero] * (n - 1) / n
    row = json.loads(open(f"{work}/{run}/metrics.jsonl").readline())
    held = sum(row["model_state_bytes"].values())
    ratio, comm = held / theory, row["comm_bytes"] / volume
    print(f"  {run}: {held} model-state bytes per rank, theory {theory:.0f} ({ratio:.3f}); "
          f"sent {row['comm_bytes']} bytes, {comm:.3f} x the stage's volume; "
          f"transient peak {row['transient_peak_bytes']} bytes")
    assert abs(ratio - 1) <= 0.05, run
    assert 1.0 <= comm <= 1.05, run
    if zero == 3:
        # Gathered parameters at their most (sharded_parameters.h): the transient peak less
        # ZeRO-2's, whose gradient buffers go the same way. A unit arrives beside the one
        # running: the embeddings with block 0 (then freed: the lookup's backward reads no
        # weight), block with block, the last block (kept for its backward) with the head.
        # fp32: 4 bytes an element. bf16: a unit is held in its 2-byte buffer, and the
        # parameters read beyond products (embeddings, norms) are widened to 4 bytes of
        # their own beside it (w: their exact elements); the embeddings' unit, all widened,
        # lets its buffer go once widened.
        e, h = padded[0], padded["head"]
        b = max(k for u, k in padded.items() if u not in (0, "head"))
        if width == 4:
            expected = 4 * max(e + b, 2 * b, b + h)
        else:
            w = unit_sizes(f"{work}/llama-1/model.safetensors", widened)
            wb = max(k for u, k in w.items() if u not in (0, "head"))
            expected = max(2 * e + 4 * w[0], 4 * w[0] + 2 * b, 4 * b + 4 * wb, 2 * b + 4 * wb + 2 * h + 4 * w["head"])
        zero2 = json.loads(open(f"{work}/{run.replace('bf16-', '').replace('zero3', 'zero2')}/metrics.jsonl").readline())
        gathered = row["transient_peak_bytes"] - zero2["transient_peak_bytes"]
        print(f"  {run}: gathered parameters peak at {gathered} bytes, expected {expected}")
        assert gathered == expected, run
PY

# Placing a model needs no more host memory than the placed model state holds: the
# model is built as shapes and each parameter drawn where it stays; under ZeRO-3 one
# unit at a time is made whole beside the pieces (parallelize.h). At 4 ranks ZeRO-3
# keeps 4 bytes x the parameters (pieces, gradient pieces, two moments, each a quarter):
# any whole copy of the model beside the pieces already exceeds it (building the model
# first, as before, held two: 2.25 x that).
# Saving the final weights holds one unit whole at a time on every ZeRO-3 rank
# (final_weights.h): at least the largest unit, which it gathers, less than three (Gloo
# gathers into a buffer of its own and copies it out: a unit more while the gather runs).
# Eight blocks make the whole model, which saving held before (and the leader a second
# copy), far more than three units. A rank that holds every parameter whole writes them as
# they are: less than a unit more (the model's shapes are built with no memory).
train llama llama-zero3-deep --nproc 2 --set parallel.zero=3 --set model.n_layers=8 --set schedule.steps=1 \
  --set schedule.warmup_steps=0 --set eval.every=0
/usr/bin/python3 - "$work" "$(dirname "$0")" <<'PY' || fail "placing or saving the model held more than it should"
import glob, re, sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from units import unit_sizes
for run, ranks in [("llama-1", 1), ("llama-zero2", 2), ("llama-zero3", 2), ("llama-x4-zero3", 4),
                   ("llama-bf16-zero3", 2), ("llama-zero3-deep", 2)]:
    units = unit_sizes(f"{work}/{run}/model.safetensors")
    largest = 4 * max(-(-k // ranks) * ranks for k in units.values())
    whole = 4 * sum(units.values())
    for log in sorted(glob.glob(f"{work}/{run}/train*.log")):
        text = open(log).read()
        held, peak = map(int, re.search(r"host tensors hold (\d+) bytes.*at most (\d+) bytes", text).groups())
        saving = int(re.search(r"final weights saved: at most (\d+) host tensor bytes", text).group(1))
        print(f"  {run} {log.rsplit('/', 1)[1]}: model state placed in {held} host tensor bytes, at most {peak} "
              f"while placing; saving held {saving} bytes more (largest unit {largest}, whole model {whole})")
        assert peak == held, (log, peak, held)
        if "zero3" in run:
            assert largest <= saving < 3 * largest, (log, saving, largest)
        else:
            assert saving < largest, (log, saving, largest)
PY

# Layouts that do not fit the world are refused before any work, naming the factors.
if $tide train "$work/llama.lua" --nproc 2 --set parallel.tp=3 --run-dir "$work/bad" --quiet 2> "$work/log"; then
  fail "tp=3 on 2 ranks was accepted"
fi
grep -q "tp = 3" "$work/log" || grep -q "model.n_heads" "$work/log" || { cat "$work/log"; fail "bad layout not explained"; }

# SIGKILL one of four workers mid-run: the job stops within 60 s and names the rank.
start_long_run kill 2 "$work/kill.log" --nproc 4
victim=$(pgrep -P "$launcher" | sed -n 3p)
[[ -n $victim ]] || fail "no worker to kill"
start=$(date +%s)
kill -9 "$victim"
status=0
wait "$launcher" || status=$?
elapsed=$(( $(date +%s) - start ))
(( status != 0 )) || fail "the launcher exited 0 after a worker was killed"
(( elapsed <= 60 )) || fail "the job took ${elapsed}s to stop"
grep -q "rank 2 (pid $victim) was killed by signal 9" "$work/kill.log" || { cat "$work/kill.log"; fail "the killed rank is not named"; }
[[ -z $(pgrep -P "$launcher" || true) ]] || fail "workers left behind"
echo "  SIGKILL of rank 2: job stopped in ${elapsed}s, status $status"
# SIGSTOP one of two workers (a hang): the other's collective times out after
# parallel.timeout_s, its error names the collective and the silent rank, and the job
# stops within 60 s.
start_long_run hang 3 "$work/hang.log" --nproc 2 --set parallel.timeout_s=5
victim=$(pgrep -P "$launcher" | sed -n 2p)
[[ -n $victim ]] || fail "no worker to stop"
start=$(date +%s)
kill -STOP "$victim"
status=0
wait "$launcher" || status=$?
elapsed=$(( $(date +%s) - start ))
kill -9 "$victim" 2>/dev/null || true
(( status != 0 )) || fail "the launcher exited 0 after a worker hung"
(( elapsed <= 60 )) || fail "the job took ${elapsed}s to stop after a hang"
# tide's own wait and Gloo's pair timeout both run out at parallel.timeout_s: whichever
# fires first words it ("did not complete within 5 s"; Gloo's "Timed out waiting ..." or
# "Application timeout caused pair closure", seen in a fresh clone's suite on 2026-12-01).
grep -Eqi "did not complete within 5 s|timed out|application timeout" "$work/hang.log" ||
  { cat "$work/hang.log"; fail "no timeout reported"; }
grep -q "rank 1 silent for" "$work/hang.log" || { cat "$work/hang.log"; fail "the hung rank is not named"; }
# Whichever collective the stop catches (a gradient reduction, or the step boundary's
# broadcast of control commands), the error gives its kind and its name.
grep -qE "(all_reduce|reduce_scatter|all_gather|broadcast) \([^)]+\) on group" "$work/hang.log" ||
  { cat "$work/hang.log"; fail "the collective is not named"; }
echo "  SIGSTOP of rank 1: job stopped in ${elapsed}s, status $status: $(grep -o 'rank 0: .*' "$work/hang.log" | head -1)"
echo "data parallel: ok"
