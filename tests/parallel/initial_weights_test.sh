#!/usr/bin/env bash
# checkpoint.init_from: a run starts from given weights instead of its initialisation.
#  - under every layout (one process, ZeRO-3 x2, tp2, pp2, dp2 ZeRO-1 with offload) each
#    rank reads its part: a step at learning rate 0 saves the given weights exactly;
#  - a tide weights file, a finished run's directory and a Hugging Face directory (a BLOOM
#    export: tied, with the embedding norm) give the same weights;
#  - training goes on from them: the first loss is the trained model's, and ZeRO-3 x2
#    fine-tunes as one process does (1e-5);
#  - weights of another architecture, or a path holding none, are refused naming why.
source "$(dirname "$0")/common.sh" "$1"

same_weights() {  # same_weights RUN_A RUN_B: every parameter bit for bit
  "${TIDE_PYTHON:-python3}" - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(run):
    raw = open(run + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return {k: (e["shape"], raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
            for k, e in header.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
for k in a:
    assert a[k] == b[k], f"{k} differs"
print(f"  {sys.argv[2].rsplit('/', 1)[1]}: {len(a)} parameters equal to {sys.argv[1].rsplit('/', 1)[1]}'s bit for bit")
PY
}

train llama llama-base
train bloom bloom-base
$tide convert export "$work/llama-base" --out "$work/llama-hf" 2> /dev/null
$tide convert export "$work/bloom-base" --out "$work/bloom-hf" 2> /dev/null

# Learning rate 0: the step changes no weight, so what is saved is what was read.
still() { train "$1" "$2" --set optimizer.lr=0 --set schedule.steps=1 --set schedule.warmup_steps=0 --set eval.every=0 \
  --set checkpoint.init_from="$3" "${@:4}"; }
# Fields of training alone may differ from the weights' (dropout, recomputation).
still llama llama-still "$work/llama-base" --set model.dropout=0.1 --set model.activation_checkpointing=true
same_weights "$work/llama-base" "$work/llama-still"
still llama llama-still-file "$work/llama-base/model.safetensors" --nproc 2 --set parallel.zero=3
same_weights "$work/llama-base" "$work/llama-still-file"
still llama llama-still-hf "$work/llama-hf" --nproc 2 --set parallel.tp=2
same_weights "$work/llama-base" "$work/llama-still-hf"
still llama llama-still-pp "$work/llama-base" --nproc 2 --set parallel.pp=2
same_weights "$work/llama-base" "$work/llama-still-pp"
still llama llama-still-offload "$work/llama-base" --nproc 2 --set parallel.zero=1 --set parallel.offload_optimizer=true
same_weights "$work/llama-base" "$work/llama-still-offload"
still bloom bloom-still-hf "$work/bloom-hf" --nproc 2 --set parallel.tp=2
same_weights "$work/bloom-base" "$work/bloom-still-hf"

# Fine-tuning from them: the trained model's loss from the first step, and the same
# steps under ZeRO-3 as in one process.
train llama llama-tuned --set checkpoint.init_from="$work/llama-base"
train llama llama-tuned-zero3 --nproc 2 --set parallel.zero=3 --set checkpoint.init_from="$work/llama-base"
compare "$work/llama-tuned" "$work/llama-tuned-zero3" 0 || fail "ZeRO-3 fine-tuning differs from one process"
"${TIDE_PYTHON:-python3}" - "$work" <<'PY' || fail "the fine-tuned run did not start from the trained weights"
import json, sys
first = lambda run: json.loads(open(f"{sys.argv[1]}/{run}/metrics.jsonl").readline())["loss"]
fresh, tuned = first("llama-base"), first("llama-tuned")
print(f"  first loss {tuned:.4f} from the trained weights, {fresh:.4f} from the initialisation")
# Ten steps at lr 1e-3 move this model's loss by more than 0.6 (common.sh).
assert tuned < fresh - 0.3, (tuned, fresh)
PY

refused llama "model.dim = 128 in the recipe, 64 in" --set model.dim=128 --set checkpoint.init_from="$work/llama-base"
# By the launcher, before any rank starts.
rm -rf "$work/refused"
refused llama "model.dim = 128 in the recipe, 64 in" --nproc 2 --set model.dim=128 \
  --set checkpoint.init_from="$work/llama-base"
ls "$work/refused"/train*.log > /dev/null 2>&1 && fail "refused weights: ranks were started"
refused llama "does not exist" --set checkpoint.init_from="$work/nowhere"
refused llama "model.family = \"llama\" in the recipe, \"bloom\" in" --set checkpoint.init_from="$work/bloom-hf"
echo "  weights of another architecture and a missing path are refused, named"
echo "PASS"
