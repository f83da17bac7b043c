#!/usr/bin/env bash
# Data parallelism with real worker processes on CPU (Gloo over loopback):
#  - dp2 and ZeRO-1 x2 reproduce one process's losses (relative 1e-5) and final
#    parameters (1e-5), for a LLaMA shape (GQA) and a BLOOM shape (ALiBi, tied);
#  - ZeRO-1 equals plain dp exactly (bytes of the weights, every loss);
#  - a worker killed with SIGKILL stops the job within 60 s, named by rank.
set -euo pipefail
tide=$1
src=$2
work=$(mktemp -d)
launcher=
trap 'if [[ -n $launcher ]]; then kill -9 $launcher 2>/dev/null || true; fi; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$work/" 2>/dev/null || true
$tide data prepare "$work/GPL-3" "$work/Apache-2.0" --out "$work/ds" --tokenizer bytes --val-fraction 0.1 2> /dev/null

write_recipe() {  # write_recipe NAME MODEL: the same run for both families
  cat > "$work/$1.lua" <<LUA
return tide.recipe {
  name = "dp-$1", seed = 7, threads = 1,
  model = $2,
  data = { path = "$work/ds", seq_len = 64, prefetch = 2 },
  batch = { micro_batch = 2, global_batch = 8 },
  optimizer = { lr = 3e-3, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 10, warmup_steps = 2 },
  eval = { every = 5, batches = 4 },
  log_every = 100,
}
LUA
}
write_recipe llama "tide.models.llama { vocab_size = 300, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, multiple_of = 32, max_seq_len = 64 }"
write_recipe bloom "tide.models.bloom { vocab_size = 300, dim = 48, n_layers = 2, n_heads = 4, max_seq_len = 64 }"

compare() {  # compare REFERENCE_RUN OTHER_RUN EXACT(0|1)
  /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
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

ref, other, exact = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
(la, va), (lb, vb) = losses(ref), losses(other)
assert len(la) == len(lb) == 10, (len(la), len(lb))
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

for shape in llama bloom; do
  echo "$shape:"
  $tide train "$work/$shape.lua" --run-dir "$work/$shape-1" --quiet 2> "$work/log" || { cat "$work/log"; fail "$shape: one process"; }
  $tide train "$work/$shape.lua" --nproc 2 --run-dir "$work/$shape-dp2" --quiet 2> "$work/log" || { cat "$work/log"; fail "$shape: dp2"; }
  $tide train "$work/$shape.lua" --nproc 2 --set parallel.zero=1 --run-dir "$work/$shape-zero1" --quiet 2> "$work/log" \
    || { cat "$work/log"; fail "$shape: ZeRO-1"; }
  compare "$work/$shape-1" "$work/$shape-dp2" 0 || fail "$shape: dp2 differs from one process"
  compare "$work/$shape-1" "$work/$shape-zero1" 0 || fail "$shape: ZeRO-1 differs from one process"
  compare "$work/$shape-dp2" "$work/$shape-zero1" 1 || fail "$shape: ZeRO-1 differs from plain dp"
  cmp -s "$work/$shape-dp2/model.safetensors" "$work/$shape-zero1/model.safetensors" || fail "$shape: ZeRO-1 weights are not dp's bytes"
done

# Optimizer offload (master slice and moments in host memory) changes no bit.
$tide train "$work/llama.lua" --nproc 2 --set parallel.zero=1 --set parallel.offload_optimizer=true \
  --run-dir "$work/llama-offload" --quiet 2> "$work/log" || { cat "$work/log"; fail "ZeRO-1 with offload"; }
compare "$work/llama-dp2" "$work/llama-offload" 1 || fail "offload differs from plain dp"

# Model-state bytes per rank against fp32 AdamW theory (psi parameters, N ranks):
# dp 16 psi, ZeRO-1 8 psi + 8 psi / N, within 5%.
$tide train "$work/llama.lua" --nproc 4 --set parallel.zero=1 --set schedule.steps=2 --set eval.every=0 \
  --run-dir "$work/llama-zero1x4" --quiet 2> "$work/log" || { cat "$work/log"; fail "ZeRO-1 x4"; }
$tide train "$work/llama.lua" --nproc 4 --set schedule.steps=2 --set eval.every=0 \
  --run-dir "$work/llama-dp4" --quiet 2> "$work/log" || { cat "$work/log"; fail "dp4"; }
psi=$($tide recipe show "$work/llama.lua" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['model']['parameters'])")
/usr/bin/python3 - "$psi" "$work" <<'PY' || fail "model-state bytes differ from the theory"
import json, sys
psi, work = int(sys.argv[1]), sys.argv[2]
cases = [("llama-dp2", 16 * psi, 2), ("llama-zero1", 8 * psi + 8 * psi / 2, 2),
         ("llama-dp4", 16 * psi, 4), ("llama-zero1x4", 8 * psi + 8 * psi / 4, 4)]
for run, theory, n in cases:
    row = json.loads(open(f"{work}/{run}/metrics.jsonl").readline())
    held = sum(row["model_state_bytes"].values())
    ratio = held / theory
    # Bytes sent per step: at least one ring all-reduce of the fp32 gradients, 8 psi (N-1)/N
    # (ZeRO-1: a reduce-scatter plus an all-gather, the same).
    comm_min = 8 * psi * (n - 1) / n
    comm = row["comm_bytes"] / comm_min
    print(f"  {run}: {held} model-state bytes per rank, theory {theory:.0f} ({ratio:.3f}); "
          f"sent {row['comm_bytes']} bytes, {comm:.3f} x the minimum")
    assert abs(ratio - 1) <= 0.05, run
    assert 1.0 <= comm <= 1.05, run
PY

# Layouts that do not fit the world are refused before any work, naming the factors.
if $tide train "$work/llama.lua" --nproc 2 --set parallel.tp=3 --run-dir "$work/bad" --quiet 2> "$work/log"; then
  fail "tp=3 on 2 ranks was accepted"
fi
grep -q "tp = 3" "$work/log" || grep -q "model.n_heads" "$work/log" || { cat "$work/log"; fail "bad layout not explained"; }

# SIGKILL one of four workers mid-run: the job stops within 60 s and names the rank.
$tide train "$work/llama.lua" --nproc 4 --set schedule.steps=100000 --set eval.every=0 \
  --run-dir "$work/kill" --quiet 2> "$work/kill.log" &
launcher=$!
for _ in $(seq 600); do
  [[ -f "$work/kill/metrics.jsonl" && $(wc -l < "$work/kill/metrics.jsonl") -ge 2 ]] && break
  sleep 0.1
done
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
echo "data parallel: ok"
