# Shared by the multi-process tests: a work directory with a small byte-level dataset,
# the test recipes (a LLaMA shape with GQA and a BLOOM shape with ALiBi, tied embeddings
# and a vocabulary of 301, which no tp > 1 divides), `train` and `compare`.
# Usage: source common.sh TIDE_BINARY
set -euo pipefail
tide=$1
work=$(mktemp -d)
launcher=
trap 'if [[ -n $launcher ]]; then kill -9 $launcher 2>/dev/null || true; fi; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$work/" 2>/dev/null || true
# Its progress lines are noise here; its error, if it fails, is what the test's log must show.
$tide data prepare "$work/GPL-3" "$work/Apache-2.0" --out "$work/ds" --tokenizer bytes --val-fraction 0.1 \
  2> "$work/prepare.log" || { cat "$work/prepare.log" >&2; fail "tide data prepare of the test corpus failed"; }

# lr 1e-3: Adam divides each element's step by its gradient's RMS, so an element whose
# gradient is nearly all cancellation turns the rounding of another summation order
# (tensor parallelism splits the reductions of every matmul) into a visible step. At
# 1e-3 ten steps still move the loss by more than 0.6 while that rounding stays under
# the 1e-5 bound on parameters; a real error moves parameters by about lr per step.
write_recipe() {  # write_recipe NAME MODEL: the same run for both families
  cat > "$work/$1.lua" <<LUA
return tide.recipe {
  name = "parallel-$1", seed = 7, threads = 1,
  model = $2,
  data = { path = "$work/ds", seq_len = 64, prefetch = 2 },
  batch = { micro_batch = 2, global_batch = 8 },
  optimizer = { lr = 1e-3, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 10, warmup_steps = 2 },
  eval = { every = 5, batches = 4 },
  log_every = 100,
}
LUA
}
write_recipe llama "tide.models.llama { vocab_size = 300, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, multiple_of = 32, max_seq_len = 64 }"
write_recipe bloom "tide.models.bloom { vocab_size = 301, dim = 48, n_layers = 2, n_heads = 4, max_seq_len = 64 }"

compare_half() {  # compare_half REFERENCE_RUN OTHER_RUN BITS: two bf16 (8) or fp16 (11) runs of another layout
  # The losses agree to the format's resolution (2^-BITS relative: 8 significant bits for
  # bf16, 11 for fp16): the layouts sum in other orders, and the rounding carries that into
  # the weights; a wrong gradient or value on the wire is off by far more.
  "${TIDE_PYTHON:-python3}" - "$1" "$2" "$3" <<'PY'
import json, sys
one, other = ([json.loads(l) for l in open(run + "/metrics.jsonl")] for run in sys.argv[1:3])
bits = int(sys.argv[3])
assert len(one) == len(other) == 10, (len(one), len(other))
for a, b in zip(one, other):
    assert abs(a["loss"] - b["loss"]) <= 2**-bits * a["loss"], (a["step"], a["loss"], b["loss"])
    assert a.get("loss_scale") == b.get("loss_scale"), (a["step"], a.get("loss_scale"), b.get("loss_scale"))
worst = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(one, other))
kind = {8: "bf16", 11: "fp16"}[bits]
print(f"  {sys.argv[2].rsplit('/', 1)[1]}: {kind} losses within {worst:.1e} relative (bound 2^-{bits} = {2**-bits:.1e})")
PY
}

compare() {  # compare REFERENCE_RUN OTHER_RUN EXACT(0|1) [STEPS, default 10]
  "${TIDE_PYTHON:-python3}" - "$1" "$2" "$3" "${4:-10}" <<'PY'
import json, struct, sys
import numpy as np

def losses(run):
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    return [r["loss"] for r in rows], [r.get("val_loss") for r in rows]

def weights(run):
    with open(run + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype=np.float32).reshape(e["shape"])
    return out

ref, other, exact, steps = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
(la, va), (lb, vb) = losses(ref), losses(other)
assert len(la) == len(lb) == steps, (len(la), len(lb), steps)
for i, (a, b) in enumerate(zip(la, lb)):
    if exact:
        assert a == b, f"step {i + 1}: loss {a} != {b}"
    else:
        assert abs(a - b) <= 1e-5 * abs(a), f"step {i + 1}: loss {a} vs {b} differs by more than 1e-5 relative"
for i, (a, b) in enumerate(zip(va, vb)):
    assert (a is None) == (b is None), f"step {i + 1}: validation ran in one run only"
    if a is not None:
        assert abs(a - b) <= 1e-5 * abs(a), f"step {i + 1}: val loss {a} vs {b}"
wa, wb = weights(ref), weights(other)
assert wa.keys() == wb.keys()
worst = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
assert worst <= 1e-5, f"parameters differ by {worst}"
print(f"  {other.rsplit('/', 1)[1]}: losses {'equal' if exact else 'within 1e-5'}, max parameter difference {worst:.2e}")
PY
}

resume_from_5() {  # resume_from_5 RECIPE FULL_RUN NEW_RUN [options]: steps 6-10 again from step 5
  local recipe=$1 full=$2 new=$3
  shift 3
  mkdir -p "$work/$new/checkpoints"
  cp -r "$work/$full/checkpoints/step-00000005" "$work/$new/checkpoints/"
  head -5 "$work/$full/metrics.jsonl" > "$work/$new/metrics.jsonl"
  train $recipe $new --resume "$work/$new/checkpoints/step-00000005" "$@"
  grep -q "resumed from" "$work/$new/train.log" || fail "$new did not resume"
}

balance_matches() {  # balance_matches REFERENCE_RUN OTHER_RUN: a mixture of experts' statistics
  "${TIDE_PYTHON:-python3}" - "$1" "$2" <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(run + "/metrics.jsonl")] for run in sys.argv[1:3]]
a, b = ([r["moe_balance"] for r in rows] for rows in runs)
worst = max(abs(x - y) / x for x, y in zip(a, b))
assert len(a) == len(b) == 10 and worst <= 1e-5, (worst, a, b)
# The max load counts the whole batch's choices on every layout: one process's, but for
# a choice a rounding apart flips, each moving it by 1 / the even share (256 rows in the
# MoE tests' runs: 8 x 64 tokens, 2 choices, 4 experts); a few are allowed.
a, b = ([r["moe_max_load"] for r in rows] for rows in runs)
assert all(abs(x - y) <= 0.02 for x, y in zip(a, b)), (a, b)
PY
}

# Two runs that must train differently: some step's loss differs by more than the 1e-5
# relative that `compare` allows two layouts of one run (their summation orders apart).
losses_differ() {  # losses_differ RUN_A RUN_B
  "${TIDE_PYTHON:-python3}" - "$1" "$2" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(run + "/metrics.jsonl")] for run in sys.argv[1:3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst > 1e-5, f"{sys.argv[2]} trains as {sys.argv[1]} does (losses within {worst:.1e})"
print(f"  {sys.argv[2].rsplit('/', 1)[1]}: losses differ from {sys.argv[1].rsplit('/', 1)[1]}'s by up to {worst:.1e} relative")
PY
}

refused() {  # refused RECIPE EXPECTED_TEXT [tide train options...]: rejected before any work, saying why
  local recipe=$1 expected=$2
  shift 2
  if $tide train "$work/$recipe.lua" --run-dir "$work/refused" --quiet "$@" 2> "$work/log"; then
    fail "accepted: $*"
  fi
  grep -q "$expected" "$work/log" || { cat "$work/log"; fail "refusal of '$*' does not say '$expected'"; }
}

# A long run in the background, returned once its metrics have `steps` rows: sets
# $launcher (the launching process) for the caller to kill or wait for.
start_long_run() {  # start_long_run RUN STEPS LOG [tide train options...]
  local run=$1 steps=$2 log=$3
  shift 3
  $tide train "$work/llama.lua" --set schedule.steps=100000 --set eval.every=0 --run-dir "$work/$run" --quiet "$@" \
    2> "$log" &
  launcher=$!
  for _ in $(seq 600); do
    [[ -f "$work/$run/metrics.jsonl" && $(wc -l < "$work/$run/metrics.jsonl") -ge $steps ]] && return
    sleep 0.1
  done
}

train() {  # train RECIPE RUN [tide train options...]
  local recipe=$1 run=$2
  shift 2
  $tide train "$work/$recipe.lua" --run-dir "$work/$run" --quiet "$@" 2> "$work/log" || { cat "$work/log"; fail "$run"; }
}

