#!/usr/bin/env bash
# Expert parallelism (parallel.ep) through `tide train` with real worker processes: the
# experts of each block spread over ep of the data-parallel ranks, tokens exchanged with
# all-to-alls, the experts' gradients reduced over the dp / ep ranks that hold the same.
#  - ep2 in dp2, under ZeRO-0/1/2/3 and ZeRO-3 with every block recomputed; ep2 in dp4
#    (two ranks hold each expert) under ZeRO-1; ep4 (one expert a rank); ep2 x pp2 and
#    ep2 x tp2: each reproduces one process's losses and final parameters (relative 1e-5)
#    and reports its balance (relative 1e-5) and max load (a few flipped choices apart);
#  - each rank holds only its experts (the log names them, and the rank's checkpoint
#    file lists no other expert's pieces); the checkpoint exports the final weights the
#    leader gathered from both ranks, byte for byte;
#  - an ep2 run resumed from its step-5 checkpoint ends with the uninterrupted run's
#    bytes; that checkpoint resumes on one process, and one process's under ep2 (1e-5);
#  - a dense model, an ep dividing neither the experts nor dp are refused naming
#    parallel.ep.
source "$(dirname "$0")/common.sh" "$1"

write_recipe moe "tide.models.llama { vocab_size = 300, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 48, moe_experts = 4, moe_top_k = 2, max_seq_len = 64 }"

same_as_one() {  # same_as_one RUN: one process's losses, parameters and balance
  compare "$work/moe-1" "$work/$1" 0 || fail "$1 differs from one process"
  balance_matches "$work/moe-1" "$work/$1" || fail "$1 reports another balance"
}

train moe moe-1 --set checkpoint.every=5
train moe moe-ep2 --nproc 2 --set parallel.ep=2 --set checkpoint.every=5
same_as_one moe-ep2
grep -q "experts \[2, 4) of each block's 4 on this rank" "$work/moe-ep2/train-rank1.log" \
  || { cat "$work/moe-ep2/train-rank1.log"; fail "rank 1 of ep2 does not say it holds experts 2 and 3"; }
"${TIDE_PYTHON:-python3}" - "$work/moe-ep2/checkpoints/step-00000005" <<'PY' || fail "ep2's checkpoint pieces"
import json, struct, sys, glob
for path in sorted(glob.glob(sys.argv[1] + "/rank-*.safetensors")):
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    rank = int(header["__metadata__"]["tide.rank"])
    pieces = json.loads(header["__metadata__"]["tide.pieces"])
    experts = {int(p["param"].split(".mlp.experts.")[1].split(".")[0]) for p in pieces if ".mlp.experts." in p["param"]}
    want = {0, 1} if rank == 0 else {2, 3}
    assert experts == want, (path, experts, want)
print("  moe-ep2: rank 0's checkpoint file holds experts 0 and 1, rank 1's experts 2 and 3")
PY
# The leader gathered the final weights from both ranks' experts; the checkpoint's pieces
# come from both rank files: the two exports are the same bytes.
$tide ckpt export "$work/moe-ep2/checkpoints/step-00000010" --out "$work/ep2-ckpt-hf" 2> /dev/null
$tide convert export "$work/moe-ep2" --out "$work/ep2-weights-hf" 2> /dev/null
cmp -s "$work/ep2-ckpt-hf/model.safetensors" "$work/ep2-weights-hf/model.safetensors" \
  || fail "export from the ep2 checkpoint differs from the export of the run's weights"
echo "  moe-ep2: its checkpoint exports the run's final weights byte for byte"
for z in 1 2 3; do
  train moe moe-ep2-zero$z --nproc 2 --set parallel.ep=2 --set parallel.zero=$z
  same_as_one moe-ep2-zero$z
done
train moe moe-ep2-zero3-ckpt --nproc 2 --set parallel.ep=2 --set parallel.zero=3 \
  --set model.activation_checkpointing=true
same_as_one moe-ep2-zero3-ckpt
train moe moe-ep2-dp4 --nproc 4 --set parallel.ep=2 --set parallel.zero=1
same_as_one moe-ep2-dp4
train moe moe-ep4 --nproc 4 --set parallel.ep=4
same_as_one moe-ep4
train moe moe-ep2-pp2 --nproc 4 --set parallel.ep=2 --set parallel.pp=2
same_as_one moe-ep2-pp2
train moe moe-ep2-tp2 --nproc 4 --set parallel.ep=2 --set parallel.tp=2
same_as_one moe-ep2-tp2

resume_from_5 moe moe-ep2 moe-ep2-resumed --nproc 2 --set parallel.ep=2
compare "$work/moe-ep2" "$work/moe-ep2-resumed" 1 || fail "the resumed ep2 run's losses differ"
cmp -s "$work/moe-ep2/model.safetensors" "$work/moe-ep2-resumed/model.safetensors" \
  || fail "the resumed ep2 run's weights are not the uninterrupted run's bytes"
echo "  moe-ep2-resumed: final weights the uninterrupted ep2 run's bytes"
resume_from_5 moe moe-ep2 moe-ep2-on-one
compare "$work/moe-1" "$work/moe-ep2-on-one" 0 || fail "ep2's checkpoint resumed on one process"
resume_from_5 moe moe-1 moe-one-on-ep2 --nproc 2 --set parallel.ep=2
compare "$work/moe-1" "$work/moe-one-on-ep2" 0 || fail "one process's checkpoint resumed under ep2"

refused llama "parallel.ep" --nproc 2 --set parallel.ep=2
refused moe "parallel.ep" --nproc 3 --set parallel.ep=3
refused moe "parallel.ep" --nproc 2 --set parallel.ep=4
echo "  a dense model under ep2, ep3 (4 experts) and ep4 in dp2 refused naming parallel.ep"
