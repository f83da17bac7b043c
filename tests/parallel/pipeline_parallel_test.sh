#!/usr/bin/env bash
# Pipeline parallelism and 3D layouts with real worker processes on CPU (Gloo over
# loopback). Each layout reproduces one process's losses (relative 1e-5) and, joined
# back into one model, its final parameters (1e-5):
#  - pp2 with 1F1B and with GPipe, for the LLaMA shape and the BLOOM shape (tied
#    embeddings: the first and last stage each hold a copy, kept equal), and with the
#    stages given in the recipe and 4 micro-batches;
#  - interleaved 1F1B (two chunks per stage) for both shapes, with dp2, ZeRO-1 and ZeRO-2
#    dp2 x pp2 (each chunk's gradients reduced during backward) and with tp2 x pp2 and
#    sequence parallelism;
#  - dp2 x pp2 (and ZeRO-1 on it, equal to it exactly), tp2 x pp2 with sequence
#    parallelism, ZeRO-2 dp2 x pp2 (both shapes: BLOOM's tied embeddings reduced after
#    their sum over the stages), and dp2 x tp2 x pp2 on 8 ranks;
#  - documents attended apart (data.document_attention) through interleaved pp2: every
#    chunk masks with the batch's documents, validation too; layers of two kinds (full
#    and windowed, each with its RoPE base) through it, each chunk's by their place;
#  - data.eod_mask_loss through dp2 x interleaved pp2: the last stage weighs each
#    micro-batch by its counted targets among the step's on both replicas;
#  - pp2 in bf16 sends bf16 between stages (half the bytes) and agrees with one process,
#    and so does pp2 in fp16 with its loss scale;
#  - the combinations that cannot work are refused up front, naming the field.
source "$(dirname "$0")/common.sh" "$1"

for shape in llama bloom; do
  echo "$shape:"
  train $shape $shape-1
  for schedule in 1f1b gpipe; do
    train $shape $shape-pp2-$schedule --nproc 2 --set parallel.pp=2 --set parallel.pipeline_schedule=$schedule
    compare "$work/$shape-1" "$work/$shape-pp2-$schedule" 0 || fail "$shape: pp2 ($schedule) differs from one process"
  done
done
# Stages given in the recipe: 3 blocks then 1, with 4 micro-batches through 1F1B.
train llama llama4-1 --set model.n_layers=4
train llama llama4-pp2-given --nproc 2 --set model.n_layers=4 --set parallel.pp=2 \
  --set "parallel.pipeline_stages=[3,1]" --set parallel.micro_batches=4
compare "$work/llama4-1" "$work/llama4-pp2-given" 0 || fail "pp2 with given stages differs from one process"
grep -q "blocks \[0, 3)" "$work/llama4-pp2-given/train.log" || { cat "$work/llama4-pp2-given/train.log"; fail "the given stages were not used"; }

# Interleaved 1F1B (parallel.virtual_stages = 2): four chunks of one block, rank 0 running
# blocks 0 and 2, rank 1 blocks 1 and 3, so every activation crosses between the ranks
# three times each way; validation goes through the chunks too. BLOOM's tied embeddings
# sit on the model's first chunk (rank 0) and its last (rank 1). ZeRO-1 dp2 x pp2 has 2
# micro-batches per replica, one group of pp; tp2 with sequence parallelism sends each
# chunk's half of the sequence.
train llama llama4-pp2-v2 --nproc 2 --set model.n_layers=4 --set parallel.pp=2 --set parallel.virtual_stages=2
compare "$work/llama4-1" "$work/llama4-pp2-v2" 0 || fail "interleaved pp2 differs from one process"
grep -q "blocks \[0, 1) \[2, 3), embeddings, 1f1b schedule interleaved over 2 virtual stages" \
  "$work/llama4-pp2-v2/train.log" || { cat "$work/llama4-pp2-v2/train.log"; fail "stage 0 did not run chunks 0 and 2"; }
train bloom bloom4-1 --set model.n_layers=4
train bloom bloom4-pp2-v2 --nproc 2 --set model.n_layers=4 --set parallel.pp=2 --set parallel.virtual_stages=2
compare "$work/bloom4-1" "$work/bloom4-pp2-v2" 0 || fail "interleaved pp2 with tied embeddings differs from one process"
train llama llama4-zero1-dp2-pp2-v2 --nproc 4 --set model.n_layers=4 --set parallel.pp=2 \
  --set parallel.virtual_stages=2 --set parallel.zero=1
compare "$work/llama4-1" "$work/llama4-zero1-dp2-pp2-v2" 0 || fail "interleaved ZeRO-1 dp2 x pp2 differs from one process"
# ZeRO-2 reduce-scatters each chunk's gradients as its pass ends; BLOOM's data-parallel
# buckets (ZeRO-0) reduce each chunk's during its last pass, the tied embeddings' after
# the two stages summed them.
train llama llama4-zero2-dp2-pp2-v2 --nproc 4 --set model.n_layers=4 --set parallel.pp=2 \
  --set parallel.virtual_stages=2 --set parallel.zero=2
grep -q "data parallel: 3 of 3 gradient units reduce during backward" "$work/log" ||
  { cat "$work/log"; fail "interleaved ZeRO-2 did not reduce during backward"; }
compare "$work/llama4-1" "$work/llama4-zero2-dp2-pp2-v2" 0 || fail "interleaved ZeRO-2 dp2 x pp2 differs from one process"
train bloom bloom4-dp2-pp2-v2 --nproc 4 --set model.n_layers=4 --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set parallel.bucket_mb=0.01
grep -Eq "data parallel: [1-9][0-9]* of [0-9]+ gradient buckets now reduce during backward" "$work/log" ||
  { cat "$work/log"; fail "interleaved dp2 x pp2 did not reduce buckets during backward"; }
compare "$work/bloom4-1" "$work/bloom4-dp2-pp2-v2" 0 || fail "interleaved dp2 x pp2 with tied embeddings differs from one process"
train llama llama4-tp2-pp2-v2-sp --nproc 4 --set model.n_layers=4 --set parallel.pp=2 \
  --set parallel.virtual_stages=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
compare "$work/llama4-1" "$work/llama4-tp2-pp2-v2-sp" 0 || fail "interleaved tp2 x pp2 differs from one process"
# Documents apart: every stage reads the batch, so each chunk masks its attention by the
# same documents; learned positions restart on the first.
train llama llama4-doc-1 --set model.n_layers=4 --set data.document_attention=true --set model.positions=learned
train llama llama4-doc-pp2-v2 --nproc 2 --set model.n_layers=4 --set data.document_attention=true \
  --set model.positions=learned --set parallel.pp=2 --set parallel.virtual_stages=2
compare "$work/llama4-doc-1" "$work/llama4-doc-pp2-v2" 0 || fail "interleaved pp2 with documents apart differs"
# data.eod_mask_loss: every stage counts the batch's targets; the last weighs each
# micro-batch's loss by them, the counts summed over the two replicas.
train llama llama4-eod-1 --set model.n_layers=4 --set data.eod_mask_loss=true
train llama llama4-eod-dp2-pp2-v2 --nproc 4 --set model.n_layers=4 --set data.eod_mask_loss=true \
  --set parallel.pp=2 --set parallel.virtual_stages=2
compare "$work/llama4-eod-1" "$work/llama4-eod-dp2-pp2-v2" 0 || fail "interleaved dp2 x pp2 with data.eod_mask_loss differs"
# Layers of two kinds (Gemma 3's): blocks 1 and 2 attend in full, 0 and 3 over a window
# of 16 of the 64 tokens with a RoPE base of their own. Each chunk takes its blocks'
# kind by their place in the whole model: rank 0 runs a windowed block and a full one.
mixed=(--set model.n_layers=4 --set model.sliding_window=16 --set "model.full_attention_layers=[1,2]"
  --set model.rope_local_theta=1000)
train llama llama4-mixed-1 "${mixed[@]}"
train llama llama4-mixed-pp2-v2 --nproc 2 "${mixed[@]}" --set parallel.pp=2 --set parallel.virtual_stages=2
compare "$work/llama4-mixed-1" "$work/llama4-mixed-pp2-v2" 0 || fail "interleaved pp2 with layers of two kinds differs"
train llama llama4-windowed-1 --set model.n_layers=4 --set model.sliding_window=16 --set model.rope_local_theta=1000
losses_differ "$work/llama4-windowed-1" "$work/llama4-mixed-1" || fail "model.full_attention_layers changed nothing"
losses_differ "$work/llama4-1" "$work/llama4-mixed-1" || fail "the windowed layers changed nothing"

# bf16 compute: activations and their gradients cross between stages in bf16, the dtype
# they have on both sides, so the bytes halve, and the losses agree with one process's.
train llama llama-bf16-1 --set precision.compute=bf16
train llama llama-bf16-pp2 --nproc 2 --set parallel.pp=2 --set precision.compute=bf16
compare_half "$work/llama-bf16-1" "$work/llama-bf16-pp2" 8 || fail "bf16 pp2 differs from one process"
"${TIDE_PYTHON:-python3}" - "$work/llama-bf16-pp2" "$work/llama-pp2-1f1b" <<'PY' || fail "bf16 pp2"
import json, sys
bf16, fp32 = ([json.loads(l) for l in open(run + "/metrics.jsonl")] for run in sys.argv[1:])
for a, b in zip(fp32, bf16):
    # the pipeline's messages halve; a few scalars (loss, gradient norm) stay as they are
    assert abs(b["comm_bytes"] - a["comm_bytes"] / 2) <= 64, (a["step"], a["comm_bytes"], b["comm_bytes"])
print(f"  bf16 pp2: {bf16[0]['comm_bytes']} bytes a step against {fp32[0]['comm_bytes']} in fp32")
PY
# fp16 compute: the loss scaled on the last stage, fp16 between the stages, the scale
# divided out in the update; the same losses and scales as one process.
train llama llama-fp16-1 --set precision.compute=fp16
train llama llama-fp16-pp2 --nproc 2 --set parallel.pp=2 --set precision.compute=fp16
compare_half "$work/llama-fp16-1" "$work/llama-fp16-pp2" 11 || fail "fp16 pp2 differs from one process"

echo "3D layouts:"
train bloom bloom-dp2-pp2 --nproc 4 --set parallel.pp=2
train bloom bloom-zero1-dp2-pp2 --nproc 4 --set parallel.pp=2 --set parallel.zero=1
train bloom bloom-tp2-pp2-sp --nproc 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
train llama llama-zero2-dp2-pp2 --nproc 4 --set parallel.pp=2 --set parallel.zero=2
train bloom bloom-zero2-dp2-pp2 --nproc 4 --set parallel.pp=2 --set parallel.zero=2
# The tied embeddings wait for their sum over the stages; every block reduces during backward.
grep -q "data parallel: 1 of 2 gradient units reduce during backward" "$work/log" ||
  { cat "$work/log"; fail "ZeRO-2 with tied embeddings did not reduce the blocks during backward"; }
train llama llama-dp2-tp2-pp2 --nproc 8 --set parallel.pp=2 --set parallel.tp=2
compare "$work/bloom-1" "$work/bloom-dp2-pp2" 0 || fail "dp2 x pp2 differs from one process"
compare "$work/bloom-dp2-pp2" "$work/bloom-zero1-dp2-pp2" 1 || fail "ZeRO-1 dp2 x pp2 differs from dp2 x pp2"
compare "$work/bloom-1" "$work/bloom-tp2-pp2-sp" 0 || fail "tp2 x pp2 differs from one process"
compare "$work/llama-1" "$work/llama-zero2-dp2-pp2" 0 || fail "ZeRO-2 dp2 x pp2 differs from one process"
compare "$work/bloom-1" "$work/bloom-zero2-dp2-pp2" 0 || fail "ZeRO-2 dp2 x pp2 with tied embeddings differs from one process"
compare "$work/llama-1" "$work/llama-dp2-tp2-pp2" 0 || fail "dp2 x tp2 x pp2 differs from one process"

refused bloom "parallel.zero" --nproc 2 --set parallel.pp=2 --set parallel.zero=3
refused bloom "model.n_layers = 2" --nproc 4 --set parallel.pp=4
refused bloom "parallel.pipeline_schedule" --nproc 2 --set parallel.pp=2 --set parallel.pipeline_schedule=zigzag
refused bloom "parallel.pipeline_stages" --nproc 2 --set parallel.pp=2 --set "parallel.pipeline_stages=[2,1]"
interleaved=(--set model.n_layers=4 --set parallel.pp=2 --set parallel.virtual_stages=2)
refused llama "parallel.pipeline_schedule" --nproc 2 "${interleaved[@]}" --set parallel.pipeline_schedule=gpipe
refused llama "parallel.virtual_stages" --nproc 2 "${interleaved[@]}" --set batch.global_batch=6
refused llama "parallel.virtual_stages" --nproc 2 --set parallel.virtual_stages=2
echo "pipeline parallel: ok"
