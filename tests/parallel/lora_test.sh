#!/usr/bin/env bash
# LoRA (model.lora_rank): the adapters train, nothing else does, and what leaves the run
# is the base with the adapters merged.
#  - from a trained base: every weight without an adapter ends the base's bit for bit,
#    every adapted one moves, and each equals W + (alpha / rank) B A of the checkpoint's
#    adapters (recomputed here); the checkpoint holds the adapters alone;
#  - dp2 under ZeRO 0, 1, 2 and 3 (which shards the frozen base too) trains as one process
#    does; activation checkpointing too, and under ZeRO-3 with it, with bf16 (which holds
#    the frozen matrices in bf16) and with the optimizer offloaded; a ZeRO-3 checkpoint
#    resumes in one process;
#  - a resumed run equals the uninterrupted one bit for bit;
#  - `tide ckpt export` of the last checkpoint is the final weights; a resume or an export
#    onto base weights other than those the adapters were trained on is refused, naming
#    the fingerprints; BLOOM's projections take adapters as well;
#  - tp2 (with sequence parallelism, with a key/value head held whole), pp2, dp2 x tp2 and
#    tp2 x pp2 train as one process does, LLaMA and BLOOM; a tp2 checkpoint resumes and
#    exports in one process, and its adapters leave the run whole;
#  - lora_dropout: tp2 with sequence parallelism draws one process's masks, a resume
#    the same bits;
#  - targets of the other family, and targets without a rank, are refused.
source "$(dirname "$0")/common.sh" "$1"

train llama base
train llama base-other --set seed=8
lora=(--set model.lora_rank=4 --set model.lora_alpha=8 --set checkpoint.init_from="$work/base" --set eval.every=0)
# Its base named relative to the directory it was started in (the export below runs in
# another).
(cd "$work" && train llama lora "${lora[@]}" --set checkpoint.every=5 --set checkpoint.init_from=base) || exit 1
"${TIDE_PYTHON:-python3}" - "$work" <<'PY' || fail "the LoRA run's weights are not the base's with its adapters merged"
import json, struct, sys
import numpy as np

def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {k: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], dtype=np.float32).reshape(e["shape"])
               for k, e in header.items() if k != "__metadata__" and e["dtype"] == "F32"}
    return tensors, header.get("__metadata__", {})

work = sys.argv[1]
base, _ = read(f"{work}/base/model.safetensors")
final, meta = read(f"{work}/lora/model.safetensors")
assert final.keys() == base.keys(), sorted(set(final) ^ set(base))
assert json.loads(meta["tide_model"])["lora_rank"] == 0, "the merged weights' model still has adapters"
ckpt, ckpt_meta = read(f"{work}/lora/checkpoints/step-00000010/rank-00000.safetensors")
pieces = json.loads(ckpt_meta["tide.pieces"])
names = {p["param"] for p in pieces}
assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in names), sorted(names)
assert len(names) == 2 * 7 * 2, len(names)  # A and B of 7 projections in 2 blocks
adapter = {}
for p in pieces:
    if p["kind"] != "param":
        continue
    whole = adapter.setdefault(p["param"], np.zeros(int(np.prod(p["global_shape"])), np.float32))
    whole[p["range"][0]:p["range"][1]] = ckpt[p["tensor"]]
adapter = {k: v.reshape(next(p["global_shape"] for p in pieces if p["param"] == k)) for k, v in adapter.items()}
scale, rank, u = 8 / 4, 4, 2.0 ** -24
merged = 0
for name, w in base.items():
    module = name[: -len(".weight")]
    if module + ".lora_A.weight" not in adapter:
        assert np.array_equal(final[name], w), f"{name} moved without an adapter"
        continue
    a, b = adapter[module + ".lora_A.weight"], adapter[module + ".lora_B.weight"]
    assert np.abs(b).max() > 0, f"{module}'s B never trained"
    expected = w + scale * (b @ a)
    # fp32 sums of rank products and one add, in other orders than tide's: each rounding
    # at most u of the magnitudes summed.
    bound = 2 * (rank + 1) * u * (np.abs(w) + scale * (np.abs(b) @ np.abs(a)))
    assert np.all(np.abs(final[name] - expected) <= bound), f"{name}: not W + scale B A"
    assert not np.array_equal(final[name], w), f"{name} did not move"
    merged += 1
print(f"  lora: {merged} projections merged with their adapters, {len(base) - merged} weights the base's bit for bit; "
      f"the checkpoint holds {len(names)} adapter matrices alone")
PY

# RUN resumed in one process from OTHER's step-5 checkpoint (its metrics up to there
# copied), checked to have resumed.
resume_in_one_process() {  # resume_in_one_process OTHER RUN [tide train options...]
  mkdir -p "$work/$2/checkpoints"
  cp -r "$work/$1/checkpoints/step-00000005" "$work/$2/checkpoints/"
  head -5 "$work/$1/metrics.jsonl" > "$work/$2/metrics.jsonl"
  train llama "$2" "${lora[@]}" "${@:3}" --resume "$work/$2/checkpoints/step-00000005"
  grep -q "resumed from" "$work/$2/train.log" || fail "$2 did not resume"
}

for zero in 0 1 2 3; do
  train llama lora-dp2-zero$zero "${lora[@]}" --nproc 2 --set parallel.zero=$zero
  compare "$work/lora" "$work/lora-dp2-zero$zero" 0
done
# The optimizer offloaded: the adapters' pieces updated on the host, the same bytes.
train llama lora-dp2-zero3-offload "${lora[@]}" --nproc 2 --set parallel.zero=3 --set parallel.offload_optimizer=true
compare "$work/lora-dp2-zero3" "$work/lora-dp2-zero3-offload" 1
cmp -s "$work/lora-dp2-zero3/model.safetensors" "$work/lora-dp2-zero3-offload/model.safetensors" ||
  fail "LoRA's ZeRO-3 offload weights are not ZeRO-3's bytes"
# What ZeRO-3 gathers at its most beyond ZeRO-2 (its gradient buffers go the same way):
# the frozen base's units as data_parallel_test.sh counts a model's (a unit arrives
# beside the one running, and in backward a unit goes as the one below it starts), and
# the adapters' two blocks at once (their other units are empty), 4 bytes an element.
"${TIDE_PYTHON:-python3}" - "$work" "$(dirname "$0")" <<'PY' || fail "ZeRO-3 under LoRA gathered more than it should"
import json, sys
sys.path.insert(0, sys.argv[2])
from units import unit_sizes
w = sys.argv[1]
pad = lambda k: -(-k // 2) * 2
frozen = {u: pad(k) for u, k in unit_sizes(f"{w}/base/model.safetensors").items()}
adapters = {u: pad(k) for u, k in unit_sizes(f"{w}/lora/adapter/adapter_model.safetensors").items()}
e, h = frozen[0], frozen["head"]
b = max(k for u, k in frozen.items() if u not in (0, "head"))
expected = 4 * max(e + b, 2 * b, b + h) + 4 * 2 * max(adapters.values())
peak = lambda run: json.loads(open(f"{w}/{run}/metrics.jsonl").readline())["transient_peak_bytes"]
gathered = peak("lora-dp2-zero3") - peak("lora-dp2-zero2")
print(f"  lora-dp2-zero3: gathered parameters peak at {gathered} bytes, expected {expected}")
assert gathered == expected
PY
# bf16: ZeRO-3 gathers the frozen matrices in bf16 and multiplies by them as they came,
# as ZeRO-2 multiplies by its working copies of the same values.
for zero in 2 3; do
  train llama lora-bf16-zero$zero "${lora[@]}" --nproc 2 --set parallel.zero=$zero --set precision.compute=bf16
done
compare_half "$work/lora-bf16-zero2" "$work/lora-bf16-zero3" 8
# Under bf16 a frozen weight only ever multiplied is held in bf16 (ZeRO-2: the matrices,
# not the norms nor the embeddings; ZeRO-3: its pieces of the whole base, which every
# gather rounds alike): the bytes the fp32 runs hold, less 2 for each. The final weights
# are the base's fp32 values with the adapters merged, as the export of the last
# checkpoint makes them.
$tide ckpt export "$work/lora-bf16-zero3/checkpoints/step-00000010" -o "$work/lora-bf16-exported" 2> /dev/null ||
  fail "the bf16 ZeRO-3 run's last checkpoint did not export"
"${TIDE_PYTHON:-python3}" - "$work" "$(dirname "$0")" <<'PY' || fail "LoRA under bf16 holds its frozen base in other bytes"
import json, sys
sys.path.insert(0, sys.argv[2])
from safetensors.numpy import load_file
from units import unit_sizes, widened
w = sys.argv[1]
params = lambda run: json.loads(open(f"{w}/{run}/metrics.jsonl").readline())["model_state_bytes"]["params"]
base = f"{w}/base/model.safetensors"
matrices = sum(unit_sizes(base, lambda name, shape: not widened(name, shape)).values())
pieces = sum(-(-k // 2) for k in unit_sizes(base).values())  # each unit padded to 2 pieces
assert params("lora-dp2-zero2") - params("lora-bf16-zero2") == 2 * matrices, (params("lora-dp2-zero2"), params("lora-bf16-zero2"), matrices)
assert params("lora-dp2-zero3") - params("lora-bf16-zero3") == 2 * pieces, (params("lora-dp2-zero3"), params("lora-bf16-zero3"), pieces)
final, exported = load_file(f"{w}/lora-bf16-zero3/model.safetensors"), load_file(f"{w}/lora-bf16-exported/model.safetensors")
assert final.keys() == exported.keys() and all((final[k] == exported[k]).all() for k in final)
print(f"  bf16: {matrices} frozen matrix elements held in bf16 (ZeRO-2), {pieces} frozen piece elements (ZeRO-3); "
      "the final weights are the export's")
PY
train llama lora-recompute "${lora[@]}" --set model.activation_checkpointing=true
compare "$work/lora" "$work/lora-recompute" 1
# ZeRO-3 holds the frozen base in pieces, gathered unit by unit as the adapters are: with
# recomputation (each block gathered again for it), and its checkpoint, which holds the
# adapters' pieces alone, resumed in one process onto the same base.
train llama lora-dp2-zero3-recompute "${lora[@]}" --nproc 2 --set parallel.zero=3 \
  --set model.activation_checkpointing=true --set checkpoint.every=5
compare "$work/lora" "$work/lora-dp2-zero3-recompute" 0
grep -q "ZeRO-3 shards the frozen base: [0-9]* of its [0-9]* elements on each of 2" "$work/lora-dp2-zero3-recompute/train.log" ||
  fail "the ZeRO-3 run does not say it shards the frozen base"
resume_in_one_process lora-dp2-zero3-recompute lora-zero3-resumed
compare "$work/lora-dp2-zero3-recompute" "$work/lora-zero3-resumed" 0

# Resumed from its step-5 checkpoint (the adapters and their moments; the base read again
# from checkpoint.init_from): steps 6-10 and the weights the uninterrupted run's bits.
resume_in_one_process lora lora-resumed
compare "$work/lora" "$work/lora-resumed" 1

# From another directory than the run's: the base is found where the run found it.
(cd / && $tide ckpt export "$work/lora/checkpoints/step-00000010" -o "$work/lora-exported" 2> "$work/log") ||
  { cat "$work/log"; fail "the export from / did not find the base"; }
"${TIDE_PYTHON:-python3}" - "$work" <<'PY' || fail "the exported checkpoint is not the final weights"
import sys
from safetensors.numpy import load_file
final = load_file(f"{sys.argv[1]}/lora/model.safetensors")
exported = load_file(f"{sys.argv[1]}/lora-exported/model.safetensors")
assert final.keys() == exported.keys()
assert all((final[k] == exported[k]).all() for k in final)
print(f"  the exported last checkpoint is the final weights, {len(final)} tensors bit for bit")
PY

# The adapters as PEFT reads them: the run's adapter/ and the checkpoint's --adapter
# export are the same tensors, and PeftModel.from_pretrained(base, adapter) gives the
# merged model's logits.
$tide ckpt export "$work/lora/checkpoints/step-00000010" -o "$work/lora-adapter" --adapter 2> /dev/null
$tide convert export "$work/base" --out "$work/base-hf" 2> /dev/null
"${TIDE_PYTHON:-python3}" - "$work" <<'PY' || fail "the checkpoint's adapter export is not the run's adapter"
import json, sys
from safetensors.numpy import load_file
run = load_file(f"{sys.argv[1]}/lora/adapter/adapter_model.safetensors")
exported = load_file(f"{sys.argv[1]}/lora-adapter/adapter_model.safetensors")
assert run.keys() == exported.keys() and all((run[k] == exported[k]).all() for k in run)
assert all(k.startswith("base_model.model.model.layers.") for k in run), sorted(run)[:3]
config = json.load(open(f"{sys.argv[1]}/lora-adapter/adapter_config.json"))
assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0), config
print(f"  adapter: {len(run)} matrices under PEFT's names, the run's and the checkpoint's export alike")
PY
"${TIDE_PYTHON:-python3}" "$(dirname "$0")/../engine/hf_lora.py" merged "$work/base-hf" "$work/lora/adapter" \
  "$work/lora-exported" || fail "PEFT's base + adapter is not the merged model"

# The base moved under the adapters: a copy of the base trained on, then replaced.
cp -r "$work/base" "$work/base-moved"
train llama lora-moved "${lora[@]}" --set checkpoint.init_from="$work/base-moved" --set checkpoint.every=5 \
  --set schedule.steps=5
cp "$work/base-other/model.safetensors" "$work/base-moved/model.safetensors"
if $tide ckpt export "$work/lora-moved/checkpoints/step-00000005" -o "$work/moved-exported" 2> "$work/log"; then
  fail "exported adapters onto another base"
fi
grep -q "trained on other base weights than its run's initial weights .*: XXH3 [0-9a-f]* recorded, [0-9a-f]* here" \
  "$work/log" || { cat "$work/log"; fail "the export's refusal does not say why"; }
refused llama "was trained on other frozen base weights than this run's ([a-z_.0-9]*: XXH3 [0-9a-f]* recorded" \
  "${lora[@]}" --set checkpoint.init_from="$work/base-moved" --resume "$work/lora-moved/checkpoints/step-00000005"
echo "  adapters onto a base other than their own: export and resume refused, naming the fingerprints"

train bloom bloom-lora --set model.lora_rank=4 --set eval.every=0
"${TIDE_PYTHON:-python3}" - "$work" <<'PY' || fail "BLOOM's adapters did not train"
import json, struct, sys
with open(f"{sys.argv[1]}/bloom-lora/checkpoints/step-00000010/rank-00000.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    pieces = json.loads(json.loads(f.read(n))["__metadata__"]["tide.pieces"])
modules = sorted({p["param"].split(".")[-3] for p in pieces})
assert modules == ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"], modules
print(f"  bloom: adapters on {', '.join(modules)}")
PY

# Tensor parallelism cuts the frozen weights and the adapters (a column-parallel layer's
# B, a row-parallel layer's A), holding the other matrix of each whole with its gradient
# summed over the ranks; pipeline stages hold their blocks' adapters. Each layout trains
# as one process does: LLaMA's GQA (two key/value heads split over two ranks, and one
# held whole by both), BLOOM's fused projection, biases and tied embeddings.
train llama lora-tp2 "${lora[@]}" --nproc 2 --set parallel.tp=2 --set checkpoint.every=5
compare "$work/lora" "$work/lora-tp2" 0
train llama lora-tp2-sp "${lora[@]}" --nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
compare "$work/lora" "$work/lora-tp2-sp" 0
train llama lora-pp2 "${lora[@]}" --nproc 2 --set parallel.pp=2
compare "$work/lora" "$work/lora-pp2" 0
train llama lora-dp2-tp2 "${lora[@]}" --nproc 4 --set parallel.tp=2 --set parallel.zero=1
compare "$work/lora" "$work/lora-dp2-tp2" 0
train llama lora-tp2-pp2 "${lora[@]}" --nproc 4 --set parallel.tp=2 --set parallel.pp=2 \
  --set parallel.sequence_parallel=true
compare "$work/lora" "$work/lora-tp2-pp2" 0
# lora_dropout: each A reads its input with elements dropped, the frozen projections
# read it whole. Tensor-parallel ranks draw in step, and a row-parallel rank keeps its
# columns of the mask of the whole input, so tp2 (with sequence parallelism: the masks
# are drawn on the gathered sequence) draws one process's masks and trains as it does; a
# resume restores the generators (the same bits); the adapter's config carries the rate.
dropout=(--set model.lora_dropout=0.25)
train llama lora-dropout "${lora[@]}" "${dropout[@]}" --set checkpoint.every=5
train llama lora-dropout-tp2 "${lora[@]}" "${dropout[@]}" --nproc 2 --set parallel.tp=2 \
  --set parallel.sequence_parallel=true
compare "$work/lora-dropout" "$work/lora-dropout-tp2" 0
resume_in_one_process lora-dropout lora-dropout-resumed "${dropout[@]}"
compare "$work/lora-dropout" "$work/lora-dropout-resumed" 1
"${TIDE_PYTHON:-python3}" - "$work" <<'PY' || fail "lora_dropout did not drop, or its adapter does not say so"
import json, sys
w = sys.argv[1]
losses = lambda run: [json.loads(l)["loss"] for l in open(f"{w}/{run}/metrics.jsonl")]
plain, dropped = losses("lora"), losses("lora-dropout")
assert plain[0] == dropped[0], "B starts at zero: the first step's loss is the base's either way"
assert all(a != b for a, b in zip(plain[1:], dropped[1:])), (plain, dropped)
assert json.load(open(f"{w}/lora-dropout/adapter/adapter_config.json"))["lora_dropout"] == 0.25
print(f"  lora_dropout 0.25: step 10's loss {dropped[-1]:.5f} against {plain[-1]:.5f} undropped")
PY
kv1=(--set model.n_kv_heads=1 --set model.lora_rank=4 --set eval.every=0)
train llama lora-kv1 "${kv1[@]}"
train llama lora-kv1-tp2 "${kv1[@]}" --nproc 2 --set parallel.tp=2
compare "$work/lora-kv1" "$work/lora-kv1-tp2" 0
# BLOOM under ZeRO-3: its tied embeddings and embedding norm, frozen, kept gathered
# through the micro-batches.
for layout in "tp=2" "pp=2" "zero=3"; do
  train bloom "bloom-lora-${layout/=/}" --set model.lora_rank=4 --set eval.every=0 --nproc 2 --set "parallel.$layout"
  compare "$work/bloom-lora" "$work/bloom-lora-${layout/=/}" 0
done
train llama lora-dp2-tp2-zero3 "${lora[@]}" --nproc 4 --set parallel.tp=2 --set parallel.zero=3
compare "$work/lora" "$work/lora-dp2-tp2-zero3" 0
# What records the base is of whole tensors: a tp2 checkpoint resumes in one process
# (and exports there) onto the same base, and its run's adapter/ is PEFT's whole
# matrices, the checkpoint's --adapter export's bit for bit.
resume_in_one_process lora-tp2 lora-tp2-resumed
compare "$work/lora-tp2" "$work/lora-tp2-resumed" 0
$tide ckpt export "$work/lora-tp2/checkpoints/step-00000010" -o "$work/lora-tp2-adapter" --adapter 2> /dev/null
$tide ckpt export "$work/lora-tp2/checkpoints/step-00000010" -o "$work/lora-tp2-exported" 2> /dev/null
"${TIDE_PYTHON:-python3}" - "$work" <<'PY' || fail "the tp2 run's adapter or export is not its checkpoint's"
import sys
from safetensors.numpy import load_file
w = sys.argv[1]
run, exported = load_file(f"{w}/lora-tp2/adapter/adapter_model.safetensors"), load_file(f"{w}/lora-tp2-adapter/adapter_model.safetensors")
one = load_file(f"{w}/lora/adapter/adapter_model.safetensors")
assert run.keys() == exported.keys() == one.keys(), sorted(set(run) ^ set(one))
assert all(run[k].shape == one[k].shape and (run[k] == exported[k]).all() for k in run)
final, merged = load_file(f"{w}/lora-tp2/model.safetensors"), load_file(f"{w}/lora-tp2-exported/model.safetensors")
assert final.keys() == merged.keys() and all((final[k] == merged[k]).all() for k in final)
print(f"  tp2: {len(run)} whole adapter matrices in adapter/, its checkpoint's bits; the export is the final weights")
PY

refused llama 'model.lora_targets\[1\]: "dense" is no projection of this model' --set model.lora_rank=4 \
  --set 'model.lora_targets=["dense"]'
refused llama "take LoRA adapters, and model.lora_rank is 0" --set 'model.lora_targets=["q_proj"]'
echo "  another family's target and targets without a rank are refused, named"
echo "PASS"
