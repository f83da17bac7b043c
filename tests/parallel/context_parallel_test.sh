#!/usr/bin/env bash
# Context parallelism with real worker processes on CPU (Gloo over loopback): each
# sequence of 64 tokens cut over cp ranks (2 cp chunks, rank r holding chunks r and
# 2 cp - 1 - r), keys and values gathered in every layer. Each layout reproduces one
# process's losses (relative 1e-5) and final parameters (1e-5):
#  - cp2 and cp4 for the LLaMA shape (RoPE at each token's own position, GQA), cp2 for
#    the BLOOM shape (ALiBi's bias across chunks, tied embeddings);
#  - with the other axes: dp2 x cp2 under ZeRO-1 (blocks recomputed in backward, their
#    gathers again), cp2 under ZeRO-3 (shards over the dp x cp ranks), cp2 x tp2 with
#    sequence parallelism, cp2 x pp2 (1F1B);
#  - documents attended apart (data.document_attention) with learned positions that
#    restart at each document, with ALiBi, and with a sliding window shorter than a chunk;
#  - data.eod_mask_loss: each rank's share of the step's counted targets;
#  - Gemma's architecture: soft-capped scores, windowed and full layers;
#  - attention dropout (chunks attended with a mask, not chunk_attention's two calls): at
#    p = 1e-9 nothing is dropped and the rest is scaled by 1 / (1 - p), so cp2 equals one
#    process;
#  - the all-to-all form (parallel.cp_comm = "all_to_all"): cp2, cp4 (key/value heads
#    shared by two ranks), BLOOM, documents under a window, Gemma, cp2 x tp2, dp2 x cp2
#    under ZeRO-1 with blocks recomputed;
#  - bf16 compute (LLaMA cp2 in both forms, BLOOM cp2) agrees with one process in bf16
#    to bf16's resolution;
#  - a cp2 checkpoint resumed by one process goes on as one process would;
#  - layouts context parallelism cannot cut are refused naming the field.
source "$(dirname "$0")/common.sh" "$1"

echo "llama and bloom:"
train llama llama-1
# Under ctest the ranks read MFU's peak from cli.calibrate's calibration, not a probe each.
if [[ -s ${XDG_CACHE_HOME:-/nonexistent}/tide/calibration-cpu.json ]]; then
  grep -q "matmul peak .* (as tide plan --calibrate stored it)" "$work/llama-1/train.log" \
    || fail "the stored calibration's matmul peak was not used"
fi
train llama llama-cp2 --nproc 2 --set parallel.cp=2
compare "$work/llama-1" "$work/llama-cp2" 0 || fail "cp2 differs from one process"
train llama llama-cp4 --nproc 4 --set parallel.cp=4
compare "$work/llama-1" "$work/llama-cp4" 0 || fail "cp4 differs from one process"
grep -q "dp1 x cp4 x tp1 x pp1" "$work/llama-cp4/train.log" || fail "the cp4 run does not say its layout"
train bloom bloom-1
train bloom bloom-cp2 --nproc 2 --set parallel.cp=2
compare "$work/bloom-1" "$work/bloom-cp2" 0 || fail "BLOOM cp2 differs from one process"

echo "with the other axes:"
train llama llama-dp2-cp2-zero1 --nproc 4 --set parallel.cp=2 --set parallel.zero=1 \
  --set model.activation_checkpointing=true
compare "$work/llama-1" "$work/llama-dp2-cp2-zero1" 0 || fail "dp2 x cp2 under ZeRO-1 differs from one process"
train llama llama-cp2-zero3 --nproc 2 --set parallel.cp=2 --set parallel.zero=3 --set checkpoint.every=5
compare "$work/llama-1" "$work/llama-cp2-zero3" 0 || fail "cp2 under ZeRO-3 differs from one process"
train llama llama-cp2-tp2-sp --nproc 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
compare "$work/llama-1" "$work/llama-cp2-tp2-sp" 0 || fail "cp2 x tp2 with sequence parallelism differs from one process"
train bloom bloom-cp2-pp2 --nproc 4 --set parallel.cp=2 --set parallel.pp=2 --set parallel.micro_batches=4
compare "$work/bloom-1" "$work/bloom-cp2-pp2" 0 || fail "cp2 x pp2 differs from one process"

echo "documents apart, windows, uncounted targets, dropout, Gemma:"
# Gemma 2's and 3's pieces (tensor_parallel_test.sh says what each is): soft-capped
# scores, a windowed layer with a RoPE base of its own before a full one.
gemma=(--set model.head_dim=32 --set model.qk_norm=true --set model.mlp=geglu --set model.norm_zero_centered=true
  --set model.embedding_scale=8 --set model.tie_embeddings=true --set model.post_norms=true
  --set model.softmax_scale=0.125 --set model.attention_softcap=0.05 --set model.final_logit_softcap=0.5
  --set model.sliding_window=16 --set "model.full_attention_layers=[1]" --set model.rope_local_theta=1000)
for case in "doc-learned:llama:--set data.document_attention=true --set model.positions=learned" \
            "doc-alibi:bloom:--set data.document_attention=true" \
            "doc-window:llama:--set data.document_attention=true --set model.sliding_window=12" \
            "eod:bloom:--set data.eod_mask_loss=true" \
            "dropout:llama:--set model.dropout=1e-9" \
            "gemma:llama:${gemma[*]}"; do
  name=${case%%:*}
  rest=${case#*:}
  shape=${rest%%:*}
  read -r -a args <<< "${rest#*:}"
  train $shape $shape-$name-1 "${args[@]}"
  train $shape $shape-$name-cp2 --nproc 2 --set parallel.cp=2 "${args[@]}"
  compare "$work/$shape-$name-1" "$work/$shape-$name-cp2" 0 || fail "$name: cp2 differs from one process"
done
losses_differ "$work/llama-doc-learned-1" "$work/llama-1" || fail "document attention changed nothing"

echo "all-to-all (heads exchanged for tokens):"
# parallel.cp_comm = "all_to_all": each rank attends the whole sequence for its share of
# the heads. cp2 splits LLaMA's 2 key/value heads; cp4 gives each key/value head to the
# two ranks whose query heads read it (their gradients summed); BLOOM's ranks each carry
# their heads' ALiBi slopes; documents apart under a window, and Gemma's soft caps, run
# one process' masks; under tp2 each tensor-parallel rank's 2 heads split over cp2.
a2a=(--set parallel.cp_comm=all_to_all)
train llama llama-a2a-cp2 --nproc 2 --set parallel.cp=2 "${a2a[@]}"
compare "$work/llama-1" "$work/llama-a2a-cp2" 0 || fail "all-to-all cp2 differs from one process"
grep -q "cp_comm.*all_to_all\|all_to_all" "$work/llama-a2a-cp2/train.log" || true
train llama llama-a2a-cp4 --nproc 4 --set parallel.cp=4 "${a2a[@]}"
compare "$work/llama-1" "$work/llama-a2a-cp4" 0 || fail "all-to-all cp4 (key/value heads shared) differs from one process"
train bloom bloom-a2a-cp2 --nproc 2 --set parallel.cp=2 "${a2a[@]}"
compare "$work/bloom-1" "$work/bloom-a2a-cp2" 0 || fail "BLOOM all-to-all cp2 differs from one process"
train llama llama-doc-window-a2a --nproc 2 --set parallel.cp=2 "${a2a[@]}" --set data.document_attention=true \
  --set model.sliding_window=12
compare "$work/llama-doc-window-1" "$work/llama-doc-window-a2a" 0 || fail "all-to-all, documents and window differ"
train llama llama-gemma-a2a --nproc 2 --set parallel.cp=2 "${a2a[@]}" "${gemma[@]}"
compare "$work/llama-gemma-1" "$work/llama-gemma-a2a" 0 || fail "all-to-all, Gemma's pieces differ from one process"
train llama llama-a2a-cp2-tp2 --nproc 4 --set parallel.cp=2 --set parallel.tp=2 "${a2a[@]}"
compare "$work/llama-1" "$work/llama-a2a-cp2-tp2" 0 || fail "all-to-all cp2 x tp2 differs from one process"
# Blocks recomputed in backward exchange again inside the recomputation.
train llama llama-a2a-dp2-cp2-zero1 --nproc 4 --set parallel.cp=2 "${a2a[@]}" --set parallel.zero=1 \
  --set model.activation_checkpointing=true
compare "$work/llama-1" "$work/llama-a2a-dp2-cp2-zero1" 0 || fail "all-to-all dp2 x cp2 under ZeRO-1 differs"

echo "bf16:"
# bf16 compute: the chunks' node (LLaMA) and masked chunks (BLOOM's ALiBi) in bf16, keys
# and values gathered and heads exchanged in bf16; each agrees with one process in bf16
# to bf16's resolution (compare_half).
bf16=(--set precision.compute=bf16)
train llama llama-bf16-1 "${bf16[@]}"
train llama llama-bf16-cp2 --nproc 2 --set parallel.cp=2 "${bf16[@]}"
train llama llama-bf16-a2a-cp2 --nproc 2 --set parallel.cp=2 "${a2a[@]}" "${bf16[@]}"
compare_half "$work/llama-bf16-1" "$work/llama-bf16-cp2" 8 || fail "bf16 cp2 differs from one process in bf16"
compare_half "$work/llama-bf16-1" "$work/llama-bf16-a2a-cp2" 8 || fail "bf16 all-to-all cp2 differs"
train bloom bloom-bf16-1 "${bf16[@]}"
train bloom bloom-bf16-cp2 --nproc 2 --set parallel.cp=2 "${bf16[@]}"
compare_half "$work/bloom-bf16-1" "$work/bloom-bf16-cp2" 8 || fail "BLOOM bf16 cp2 differs from one process in bf16"

echo "resume:"
# The cp2 ZeRO-3 run's step-5 checkpoint (its shards spread over both cp ranks) resumed
# by one process: steps 6-10 as one process trains them.
mkdir -p "$work/llama-cp2-resumed/checkpoints"
cp -r "$work/llama-cp2-zero3/checkpoints/step-00000005" "$work/llama-cp2-resumed/checkpoints/"
head -5 "$work/llama-cp2-zero3/metrics.jsonl" > "$work/llama-cp2-resumed/metrics.jsonl"
train llama llama-cp2-resumed --resume "$work/llama-cp2-resumed/checkpoints/step-00000005"
grep -q "resumed from" "$work/llama-cp2-resumed/train.log" || fail "the cp2 checkpoint did not resume"
compare "$work/llama-1" "$work/llama-cp2-resumed" 0 || fail "a cp2 checkpoint resumed by one process differs"
"${TIDE_PYTHON:-python3}" - "$work/llama-cp2-zero3/checkpoints/step-00000005/manifest.json" <<'PY' ||
import json, sys
layout = json.load(open(sys.argv[1]))["layout"]
assert (layout["world"], layout["dp"], layout["cp"], layout["zero"]) == (2, 1, 2, 3), layout
PY
  fail "the cp2 checkpoint's manifest does not record its layout"

echo "refusals:"
refused llama "parallel.cp" --nproc 3 --set parallel.cp=3
refused llama "dp x cp x tp x pp = 2 x 2 x 1 x 1 = 4 ranks, but the world has 2" --nproc 2 --set parallel.cp=2 \
  --set parallel.dp=2
# 36 tokens: 18 a rank, which tp = 4 does not divide.
refused llama "parallel.sequence_parallel" --nproc 8 --set parallel.cp=2 --set parallel.tp=4 \
  --set parallel.sequence_parallel=true --set data.seq_len=36
# 4 query heads over cp = 8 ranks (16 tokens, 1 a chunk): all_gather would take it.
refused llama "parallel.cp_comm" --nproc 8 --set parallel.cp=8 "${a2a[@]}" --set data.seq_len=16
echo "context parallel: ok"
