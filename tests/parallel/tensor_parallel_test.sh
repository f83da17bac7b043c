#!/usr/bin/env bash
# Tensor parallelism with real worker processes on CPU (Gloo over loopback). Each
# layout reproduces one process's losses (relative 1e-5) and, joined back into one
# model, its final parameters (1e-5):
#  - tp2 and tp2 with sequence parallelism, for the LLaMA shape (4 query heads, 2
#    key/value heads split across ranks) and the BLOOM shape (ALiBi, tied embeddings,
#    a vocabulary of 301 padded to 302);
#  - tp2 with one key/value head (held whole by both ranks, each using it for its heads);
#  - dp2 x tp2, ZeRO-1 dp2 x tp2 (equal to dp2 x tp2 exactly) and ZeRO-3 dp2 x tp2 with
#    sequence parallelism; bf16 ZeRO-3 dp2 x tp2 with one key/value head agrees with one
#    bf16 process to bf16's resolution;
#  - bf16 tp2 with sequence parallelism (BLOOM: biases) agrees with one bf16 process to
#    bf16's resolution;
#  - documents attended apart (data.document_attention) under tp2 with sequence
#    parallelism: BLOOM (ALiBi with -inf across documents) and LLaMA with learned
#    positions (restarting at each document, each rank adding its part of the sequence's),
#    and LLaMA with a sliding window (model.sliding_window) as well;
#  - heads wider than dim / n_heads (model.head_dim) with query/key norms (model.qk_norm)
#    split across tp2, and with Gemma's architecture (GeGLU, zero-centred norms, scaled
#    tied embeddings, Gemma 2's soft-caps, Gemma 3's layers of two kinds) under tp2 with
#    sequence parallelism;
#  - data.eod_mask_loss under tp2 with sequence parallelism (BLOOM's padded vocabulary:
#    uncounted rows take part in the shards' softmax statistics and count for nothing);
#  - layouts the model cannot be cut into are refused naming the field.
source "$(dirname "$0")/common.sh" "$1"

for shape in llama bloom; do
  echo "$shape:"
  train $shape $shape-1
  train $shape $shape-tp2 --nproc 2 --set parallel.tp=2
  train $shape $shape-tp2-sp --nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
  compare "$work/$shape-1" "$work/$shape-tp2" 0 || fail "$shape: tp2 differs from one process"
  compare "$work/$shape-1" "$work/$shape-tp2-sp" 0 || fail "$shape: tp2 with sequence parallelism differs"
done

echo "llama, one key/value head:"
train llama llama-kv1 --set model.n_kv_heads=1
train llama llama-kv1-tp2 --nproc 2 --set model.n_kv_heads=1 --set parallel.tp=2
compare "$work/llama-kv1" "$work/llama-kv1-tp2" 0 || fail "tp2 with a replicated key/value head differs"

echo "data x tensor parallel:"
train bloom bloom-dp2-tp2 --nproc 4 --set parallel.tp=2
train bloom bloom-zero1-dp2-tp2 --nproc 4 --set parallel.tp=2 --set parallel.zero=1
train llama llama-zero3-dp2-tp2-sp --nproc 4 --set parallel.tp=2 --set parallel.zero=3 --set parallel.sequence_parallel=true
compare "$work/bloom-1" "$work/bloom-dp2-tp2" 0 || fail "dp2 x tp2 differs from one process"
compare "$work/bloom-dp2-tp2" "$work/bloom-zero1-dp2-tp2" 1 || fail "ZeRO-1 dp2 x tp2 differs from dp2 x tp2"
compare "$work/llama-1" "$work/llama-zero3-dp2-tp2-sp" 0 || fail "ZeRO-3 dp2 x tp2 differs from one process"
# bf16 ZeRO-3 holds the gathered projections in bf16 alone, but not a key/value head held
# whole, whose rows each rank reads from the fp32 weights (transformer.h).
train llama llama-kv1-bf16 --set model.n_kv_heads=1 --set precision.compute=bf16
train llama llama-kv1-bf16-zero3-dp2-tp2 --nproc 4 --set model.n_kv_heads=1 --set precision.compute=bf16 \
  --set parallel.tp=2 --set parallel.zero=3
compare_half "$work/llama-kv1-bf16" "$work/llama-kv1-bf16-zero3-dp2-tp2" 8 \
  || fail "bf16 ZeRO-3 dp2 x tp2 with a replicated key/value head differs"

# bf16 across ranks: the row-parallel layers' biases (BLOOM) and the projections' casts.
echo "bloom, bf16:"
train bloom bloom-bf16-1 --set precision.compute=bf16
train bloom bloom-bf16-tp2-sp --nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set precision.compute=bf16
compare_half "$work/bloom-bf16-1" "$work/bloom-bf16-tp2-sp" 8 || fail "bf16 tp2 with sequence parallelism differs"

# Each rank masks the whole sequence for its heads; the losses differ from attention that
# spans the windows (some windows hold the end of one document and the start of another).
echo "document attention:"
train bloom bloom-doc-1 --set data.document_attention=true
train bloom bloom-doc-tp2-sp --nproc 2 --set data.document_attention=true --set parallel.tp=2 \
  --set parallel.sequence_parallel=true
compare "$work/bloom-doc-1" "$work/bloom-doc-tp2-sp" 0 || fail "tp2 with sequence parallelism and documents apart differs"
losses_differ "$work/bloom-1" "$work/bloom-doc-1" || fail "data.document_attention changed nothing"
train llama llama-doc-learned-1 --set data.document_attention=true --set model.positions=learned
train llama llama-doc-learned-tp2-sp --nproc 2 --set data.document_attention=true --set model.positions=learned \
  --set parallel.tp=2 --set parallel.sequence_parallel=true
compare "$work/llama-doc-learned-1" "$work/llama-doc-learned-tp2-sp" 0 ||
  fail "tp2 with sequence parallelism and learned positions restarting at each document differs"
# A sliding window of 16 of the 64 tokens on top: each rank masks the whole sequence
# with the window and the documents, as one process does.
train llama llama-doc-window-1 --set data.document_attention=true --set model.sliding_window=16
train llama llama-doc-window-tp2-sp --nproc 2 --set data.document_attention=true --set model.sliding_window=16 \
  --set parallel.tp=2 --set parallel.sequence_parallel=true
compare "$work/llama-doc-window-1" "$work/llama-doc-window-tp2-sp" 0 ||
  fail "tp2 with sequence parallelism, a sliding window and documents apart differs"
echo "eod mask loss:"
train bloom bloom-eod-1 --set data.eod_mask_loss=true
train bloom bloom-eod-tp2-sp --nproc 2 --set data.eod_mask_loss=true --set parallel.tp=2 \
  --set parallel.sequence_parallel=true
compare "$work/bloom-eod-1" "$work/bloom-eod-tp2-sp" 0 || fail "tp2 with sequence parallelism and data.eod_mask_loss differs"
train llama llama-doc-1 --set data.document_attention=true
# Heads of their own width (model.head_dim = 32: 4 heads make attention 128 wide at dim
# 64) with query/key norms (Qwen3): each rank's query and output projections hold its
# heads at that width, and each holds the norms whole, their gradients summed over ranks.
train llama llama-wide-1 --set model.head_dim=32 --set model.qk_norm=true
train llama llama-wide-tp2 --nproc 2 --set model.head_dim=32 --set model.qk_norm=true --set parallel.tp=2
compare "$work/llama-wide-1" "$work/llama-wide-tp2" 0 || fail "tp2 with model.head_dim and model.qk_norm differs from one process"
# Gemma 2's and 3's pieces on top (a GeGLU MLP, norms multiplying by 1 + weight,
# embeddings scaled by sqrt(dim) and tied, norms after attention and the MLP, a softmax
# scale of its own; soft-capped scores, each rank capping its heads', and logits, each
# rank capping its vocabulary's before the softmax that spans them; a windowed layer with
# a RoPE base of its own before a full one) under tp2 with sequence parallelism: every
# norm, the query and key norms and the post-norms of each rank's part of the sequence
# too, adds its 1 to the weight each rank holds whole.
gemma=(--set model.head_dim=32 --set model.qk_norm=true --set model.mlp=geglu --set model.norm_zero_centered=true
  --set model.embedding_scale=8 --set model.tie_embeddings=true --set model.post_norms=true
  --set model.softmax_scale=0.125 --set model.attention_softcap=0.05 --set model.final_logit_softcap=0.5
  --set model.sliding_window=16 --set "model.full_attention_layers=[1]" --set model.rope_local_theta=1000)
train llama llama-gemma-1 "${gemma[@]}"
train llama llama-gemma-tp2-sp --nproc 2 "${gemma[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
compare "$work/llama-gemma-1" "$work/llama-gemma-tp2-sp" 0 ||
  fail "tp2 with sequence parallelism and Gemma's architecture differs from one process"
losses_differ "$work/llama-doc-1" "$work/llama-doc-window-1" || fail "model.sliding_window changed nothing"

# Layouts the model cannot be cut into: refused before any worker starts.
refused llama "model.n_heads = 3" --nproc 2 --set parallel.tp=2 --set model.n_heads=3 --set model.n_kv_heads=1 --set model.dim=48
refused llama "parallel.sequence_parallel" --nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set data.seq_len=63
refused llama "n_kv_heads = 3" --nproc 2 --set parallel.tp=2 --set model.n_heads=6 --set model.n_kv_heads=3 --set model.dim=48
echo "tensor parallel: ok"
