// What one rank holds at its peak, following the engine's code paths:
//   flat buffers (flat_parameters.h): fp32 parameters and gradients, whole or (ZeRO) the
//     rank's pieces of every unit, each unit padded to a multiple of dp;
//   AdamW (adamw.h): two fp32 moments over the owned elements, and with offload a host
//     master and gradient copy instead, all in host memory;
//   bf16 compute (compute_dtype.h): the bf16 working copy of the flat buffer that AdamW
//     writes (one process, dp without ZeRO), else one copy of every matmul weight cast
//     per step (ZeRO-3: none, its gathered units are the copies; a tied head's, cast in
//     forward and again in backward);
//   ZeRO-3 (sharded_parameters.h): the running block's unit and the prefetched one (under
//     bf16 compute gathered and held in bf16 from the rank's piece cast for it, norms and
//     biases widened beside it, the embeddings' unit widened whole), the
//     embeddings' unit at a forward's start (for the step when read after the lookup: tied
//     or normed), the last block's beside the head's from the loss through the head's
//     backward; ZeRO-2/3 (sharded_gradients.h): each unit's gradients in a buffer until
//     reduce-scattered (tied, unit 0's for the whole backward), two reduce-scatters in
//     flight (walked moment by moment: sharded_gradients_peak);
//   autograd's saved tensors per block (layers.cpp), the attention masks the blocks share
//     (transformer.cpp), the gradients the loss makes in its forward and a chunk of its
//     logits (linear_cross_entropy.cpp), the micro-batches a pipeline schedule keeps in
//     flight (pipeline.cpp);
//   the temporaries of the backward step that makes the most at once.
//   context parallelism (context_parallel.h): each rank's share of the tokens; a block
//     attending without masks keeps its own keys and values and gathers the whole
//     sequence's again in backward, a masked one keeps the gathered ones; the masks of
//     its two chunks. The all-to-all form keeps the whole sequence's q, k and v of the
//     rank's heads and the output twice (attention's and the projection's), and the masks
//     of one process for its heads.
//   a mixture of experts (moe_layer.cpp): what moe_saved counts in place of the MLP's, and
//     under expert parallelism the rank's experts in flat buffers of their own, padded for
//     and sharded over the dp / ep ranks that hold them (parallelize.cpp).
// Shape legend: B micro-batch, T sequence, Q this rank's tokens of a sequence (T / cp),
// Tn the residual stream's sequence on this rank (Q / tp with sequence parallelism),
// N = B*Q, D dim, Hd head dim, F this rank's MLP width, V this rank's vocabulary rows, s
// the compute dtype's bytes.
#include <algorithm>
#include <limits>
#include <numeric>

#include "estimates.h"
#include "rank_model.h"
#include "tide/engine/model/cross_entropy_chunks.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/parallel/pipeline_schedule.h"

namespace tide::plan {

namespace {

struct Shape {
  double B, T, Q, Tn, N, Nn, s;
  int cp = 1;
  // The keys a query of a layer attending in full computes scores for: the sequence, or
  // under context parallelism the mean over this rank's two chunks, each masked over the
  // keys up to its last query: (2 cp + 1) T / (4 cp).
  // The all-to-all form (by_heads) attends the whole sequence, as one process does.
  double keys() const { return cp > 1 && !by_heads ? (2.0 * cp + 1) * T / (4.0 * cp) : T; }
  bool by_heads = false;
  bool fused_attention = true;
  bool gpu_kernels = false;  // tide's CUDA kernels run (a GPU, not the host)
};

// The key/value heads' worth a token of this rank keeps in a block's attention: its K,
// or under all-to-all context parallelism the whole sequence's heads of its share (K /
// cp, or the one head several ranks receive), K' cp a token of its own.
double kept_kv_heads(const RankModel& r, const Shape& x) {
  return static_cast<double>(x.by_heads ? context_kv_heads_exchanged(r.kv_heads, x.cp) : r.kv_heads);
}

// The keys and values of a micro-batch's whole sequence, as context parallelism gathers
// them for a block: [B, T, 2 K Hd].
double gathered_keys_values(const RankModel& r, const Shape& x) {
  return x.B * x.T * 2 * static_cast<double>(r.kv_heads * r.head_dim) * x.s;
}

// A materialised attention's T x `keys` tensors of one block and micro-batch: the
// softmax's probabilities (kept for its backward and the product with V) and, under
// dropout, the dropped copy and its one-byte mask.
double block_scores(const ModelConfig& m, const RankModel& r, const Shape& x, double keys) {
  if (x.fused_attention) return 0;
  const double scores = x.B * static_cast<double>(r.heads) * x.Q * keys;
  return scores * (x.s + (m.dropout > 0 ? x.s + 1 : 0));
}

// LoRA's saved tensors of one block and micro-batch (layers.cpp): each adapter's B keeps
// A's product, `rank` wide. Without dropout the column-parallel layers' A products come
// out of the normed pass, which keeps no input, and an adapted down projection's A keeps
// the MLP's product, which the frozen projection alone makes again (glu_down); under
// lora_dropout every A keeps its dropped copy of its input and the scaled mask.
double lora_saved(const ModelConfig& m, const RankModel& r, const Shape& x) {
  double bytes = 0;
  for (const auto& name : lora_target_names(m)) {
    const bool row = projection_split(m, name, 1) == ProjectionSplit::Row;
    const bool mlp_out = name == "down_proj" || name == "dense_4h_to_h";
    const double in = !row      ? static_cast<double>(r.dim)
                      : mlp_out ? static_cast<double>(r.ffn)
                                : static_cast<double>(r.heads * r.head_dim);
    bytes += x.N * static_cast<double>(m.lora_rank) * x.s;
    if (m.lora_dropout > 0)
      bytes += 2 * x.N * in * x.s;
    else if (name == "down_proj" && gated_mlp(m))
      bytes += x.N * in * x.s;
  }
  return bytes;
}

// A mixture of experts' saved tensors of one block and micro-batch (moe_layer.cpp), its
// tokens split evenly among the experts (routing at its balance):
//   - the plain norm before it keeps its input in fp32 and a statistic a row;
//   - the router its fp32 input (the norm's output, widened under bf16) and its
//     probabilities, top-k the chosen experts' indices, normalising the weights and their
//     sum;
//   - the routed rows, each token once per choice it keeps (model.moe_capacity_factor),
//     kept by their experts' projections
//     (views of one tensor), each expert's gate and up outputs (an MLP's, above), the
//     experts' output and the combining weights kept by their product;
//   - the indices that route and combine (the choices' order and their tokens), and under
//     expert parallelism those that regroup the arrived rows by expert and back;
//   - a shared expert's gate and up outputs, its input (the norm's output: under fp32 the
//     router's input already), and where gated its output and the gate's sigmoid;
//   - sigmoid scores under a balance loss: each token's sum, which divides them into the
//     balance's probabilities; a router z-loss: the logits and their logsumexp.
double moe_saved(const ModelConfig& m, const RankModel& r, const Shape& x) {
  const double D = static_cast<double>(r.dim), F = static_cast<double>(r.ffn);
  const double E = static_cast<double>(m.moe_experts), k = static_cast<double>(r.top_k);
  const double statistics = m.norm == NormKind::LayerNorm ? 2 : 1;
  double bytes = x.N * (D * 4 + statistics * 4);
  bytes += x.N * (D * 4 + E * 4 + k * 8 + (m.moe_normalize_top_k ? (k + 1) * 4 : 0));
  bytes += x.N * (r.kept_choices * (2 * D + 2 * F) + k) * x.s;
  bytes += x.N * k * 8 * (r.experts_apart ? 4 : 2);
  if (r.shared_ffn > 0) {
    bytes += x.N * (2 * static_cast<double>(r.shared_ffn) + (x.s < 4 ? D : 0)) * x.s;
    if (m.moe_shared_gate) bytes += x.N * (D + 1) * x.s;
  }
  if (m.moe_router == MoeRouterScore::Sigmoid && m.moe_aux_loss > 0) bytes += x.N * 4;
  if (m.moe_z_loss > 0) bytes += x.N * (E + 1) * 4;
  return bytes;
}

// Autograd's saved tensors of one block and micro-batch, run without recomputation; the
// block `windowed` where its window is shorter than the sequence, `unmasked_context`
// where context parallelism attends it without masks (unmasked_context_layer).
double block_saved(const ModelConfig& m, const RankModel& r, const Shape& x, bool windowed, bool unmasked_context) {
  const double D = static_cast<double>(r.dim), hd = static_cast<double>(r.head_dim);
  const double H = static_cast<double>(r.heads), K = kept_kv_heads(r, x);
  const double F = static_cast<double>(r.ffn);
  // A norm and the projections after it are one node (normed_projections), which keeps
  // the residual stream as it is (this rank's part of the sequence) and makes the norm's
  // output again in backward, gathered again under sequence parallelism.
  double bytes = 2 * x.Nn * D * x.s;
  if (x.by_heads) {
    // All-to-all context parallelism: attention keeps the exchanged q, k and v (neither
    // the RoPE'd ones of this rank's tokens nor BLOOM's fused output), and the output of
    // its heads beside the projection's input, the output of its tokens.
    bytes += x.N * (2 * H + 2 * K) * hd * x.s;
    if (m.qk_norm) bytes += x.N * (H + static_cast<double>(r.kv_heads)) * (hd * x.s + 4);
  } else if (m.family == Family::BLOOM) {
    bytes += x.N * 3 * H * hd * x.s;  // the fused q, k, v output, kept whole by their views
  } else {
    // q and k after RoPE (new tensors; the rotation itself keeps only cos and sin), v a
    // view of its projection: what attention keeps.
    bytes += x.N * (H + 2 * K) * hd * x.s;
    // Query/key norms keep their inputs (the q and k projections' outputs) and one fp32
    // statistic per head.
    if (m.qk_norm) bytes += x.N * (H + K) * (hd * x.s + 4);
  }
  bytes += x.N * H * hd * x.s;  // attention's output, kept by it and the output projection
  // A window shorter than the sequence is attended in parts (attention_masks.h): each block
  // of R queries keeps its own copy of the R + w keys and values it reads (w / R times
  // them beyond one), and the parts' outputs are kept by their calls beside the joined one.
  double keys = x.keys();  // a query's scores computed
  if (x.cp > 1 && unmasked_context) {
    // One node (unmasked_context_attention) keeps q, this rank's keys and values stacked
    // (for the RoPE'd k and the view v, counted above), the joined output, and beside the
    // merged rows' log-sum-exp each kernel call's own, two more a row.
    bytes += 2 * x.B * H * x.Q * 4;
  } else if (x.cp > 1 && !x.by_heads) {
    // Context parallelism: the gathered keys and values of the whole sequence, kept by
    // both chunks' attention, and each chunk's output beside the joined one. A windowed
    // chunk reads the keys its window reaches (about a chunk and a window).
    bytes += gathered_keys_values(r, x) + x.N * H * hd * x.s;
    if (windowed) keys = std::min(keys, x.T / (2.0 * x.cp) + static_cast<double>(m.sliding_window));
  } else if (windowed) {
    const double w = static_cast<double>(m.sliding_window);
    const double rows = static_cast<double>(window_block_rows(m.sliding_window));
    bytes += x.N * (2 * K * hd * w / rows + H * hd) * x.s;
    keys = rows + w;
  }
  if (x.fused_attention)
    bytes += x.B * H * x.Q * 4;  // its log-sum-exp per row
  else
    bytes += block_scores(m, r, x, keys);
  // SwiGLU keeps the gate's and up's outputs, and the down projection recomputes their
  // product in backward (fused_ops.cpp, glu_down); GELU keeps its input and output. A
  // mixture of experts instead keeps what moe_saved counts, its norm a plain one.
  if (r.experts > 0)
    bytes += moe_saved(m, r, x) - x.Nn * D * x.s;
  else
    bytes += 2 * x.N * F * x.s;
  // Post-norms (Gemma 2 and 3) keep their inputs, attention's and the MLP's outputs
  // (this rank's part of the sequence), and one fp32 statistic a row.
  if (m.post_norms) bytes += 2 * x.Nn * (D * x.s + 4);
  if (m.lora_rank > 0) bytes += lora_saved(m, r, x);
  return bytes;
}

// The most backward of one block holds beyond the saved tensors, the incoming gradient
// and one weight gradient before it is added into the flat buffer at every moment:
//   - the MLP's gradients at their widest: three of width F for SwiGLU while the down
//     projection's node runs (the product's gradient and the gate's and up's, the product
//     recomputed and gone by then), one for GELU;
//   - a materialised attention's probabilities' and scores' gradients;
//   - a normed_projections node (fused_ops.h): its outputs' gradients (the MLP's gate
//     and up, or q, k and v), the norm's output made again, the sum of the gradients
//     that reach it and the one being added, and the norm's fp32 copy of its input where
//     the statistics are not tide's CUDA kernel's.
//   - context parallelism's node without masks (unmasked_context_attention): the
//     gradients of the whole sequence's keys and values, a chunk's of the keys before it
//     (at most the whole sequence's), the chunk's output, output gradient and query
//     gradients, and the gathered keys and values, fetched again where the block was
//     kept whole (`regathered`; a recomputed block's are among its saved tensors).
//   - all-to-all context parallelism's exchange of the gradients of q, k and v back to
//     this rank's tokens: the gradients, the buffer sent and the one received.
// (Measured with the counting allocator: 13.2 MiB for B 8, T 256, D 256, F 704, when
// SwiGLU kept its product and two were counted.)
double block_backward_extra(const ModelConfig& m, const RankModel& r, const Shape& x, bool unmasked_context,
                            bool regathered) {
  const double D = static_cast<double>(r.dim), F = static_cast<double>(r.ffn);
  const double incoming = x.Nn * D * x.s;
  const double scores = x.fused_attention ? 0.0 : 2 * x.B * static_cast<double>(r.heads) * x.Q * x.keys() * x.s;
  const double qkv = static_cast<double>((r.heads + 2 * r.kv_heads) * r.head_dim);
  const double mlp_in = (gated_mlp(m) ? 2 : 1) * F;
  const bool fp32_copy = x.s < 4 && (!x.gpu_kernels || m.norm == NormKind::LayerNorm);
  const double node = 3 * x.N * D * x.s + (fp32_copy ? x.Nn * D * 4 : 0);
  double extra = std::max(incoming + scores,
                          incoming + x.N * qkv * x.s + node + D * static_cast<double>(r.heads * r.head_dim) * 4);
  if (r.experts > 0) {
    // A mixture of experts' widest moment: an expert's backward (its rows' MLP gradients
    // and input gradient, a weight's gradient), beside the experts' output gradient, the
    // routed rows' gradient summed so far and the next expert's part of it (autograd's
    // slice backward makes each the routed rows' size).
    const double rows = x.N * r.kept_choices;
    const double expert_rows = rows / static_cast<double>(r.experts);
    extra = std::max(extra,
                     incoming + 3 * rows * D * x.s + expert_rows * ((gated_mlp(m) ? 3 : 1) * F + D) * x.s + D * F * 4);
    // The shared expert's backward: its MLP-wide gradients, as a dense MLP's.
    const double S = static_cast<double>(r.shared_ffn);
    if (S > 0) extra = std::max(extra, incoming + (gated_mlp(m) ? 3 : 1) * x.N * S * x.s + D * S * 4);
  } else {
    extra = std::max({extra, incoming + (gated_mlp(m) ? 3 : 1) * x.N * F * x.s + D * F * 4,
                      incoming + x.N * mlp_in * x.s + node + D * F * 4});
  }
  if (x.by_heads) {
    const double exchanged =
        x.N * (static_cast<double>(r.heads) + 2 * kept_kv_heads(r, x)) * static_cast<double>(r.head_dim) * x.s;
    extra = std::max(extra, incoming + 3 * exchanged);
  }
  if (unmasked_context) {
    const double gathered = gathered_keys_values(r, x);
    extra = std::max(
        extra, incoming + (regathered ? 3 : 2) * gathered + 2 * x.N * static_cast<double>(r.heads * r.head_dim) * x.s);
  }
  return extra;
}

// Under context parallelism each kind of layer's masks are rank 0's two chunks' (c = T /
// (2 cp) queries each; transformer.cpp: context_of): the first over its own c keys, the
// last over the whole sequence (a window's kind: about a chunk and a window), once for
// the run, or with documents apart once for each micro-batch in flight, B of them.
// ALiBi's bias has a row per head. A chunk that sees every key before it needs none
// (chunk_attention.h): without ALiBi or documents, only a window shorter than the
// sequence makes masks, the last chunk's, and the first's where it is shorter than c.
double context_masks(const ModelConfig& m, const Shape& x, double heads, const PipelineStage& stage,
                     const std::vector<int64_t>& in_flight, bool documents) {
  const double c = x.T / (2.0 * x.cp), w = static_cast<double>(m.sliding_window);
  const bool masked = documents || m.positions == PositionKind::ALiBi;
  const double full = masked ? heads * c * (c + x.T) * x.s : 0;
  const double windowed = heads * c * ((masked || w < c ? c : 0) + std::min(x.T, c + w)) * x.s;
  const auto seq = static_cast<int64_t>(x.T);
  bool any_full = false, any_windowed = false;
  double bytes = 0;
  for (size_t i = 0; i < stage.chunks.size(); ++i) {
    const BlockRange& range = stage.chunks[i];
    const int64_t end = range.end < 0 ? m.n_layers : range.end;
    bool has_full = false, has_windowed = false;
    for (int64_t layer = range.first; layer < end; ++layer)
      (window_leaves_out_keys(m, layer, seq) ? has_windowed : has_full) = true;
    any_full = any_full || has_full;
    any_windowed = any_windowed || has_windowed;
    if (documents)
      bytes += static_cast<double>(in_flight[i]) * x.B * ((has_full ? full : 0) + (has_windowed ? windowed : 0));
  }
  return documents ? bytes : (any_full ? full : 0) + (any_windowed ? windowed : 0);
}

// The masks attention adds to its scores (transformer.cpp: bias_of, window_of,
// block_inputs), in the compute dtype, each one tensor that every block of its kind in a
// chunk keeps for backward. Layers attending in full: ALiBi's bias [1, H, T, T] is made
// once for the run, per kind of layer on the stage (windowed, full); with documents apart
// each micro-batch in flight through a chunk has its own [B, H or 1, T, T] per kind the
// chunk holds. A window shorter than the sequence attends in parts (attention_masks.h):
// without documents their band [1, H or 1, R, R + w] once for the run (with ALiBi also
// the first w queries' [1, H, w, w]); with documents each micro-batch's [B, H or 1, w, w]
// and [B n, H or 1, R, R + w] for the rest of the sequence. H: ALiBi's heads on this rank.
double attention_masks(const ModelConfig& m, const RankModel& r, const Shape& x, const PipelineStage& stage,
                       const std::vector<int64_t>& in_flight, bool documents) {
  const bool alibi = m.positions == PositionKind::ALiBi;
  // All-to-all context parallelism: one process' masks for this rank's share of the heads.
  const double heads = alibi ? static_cast<double>(r.heads) / (x.by_heads ? x.cp : 1) : 1.0;
  if (x.cp > 1 && !x.by_heads) return context_masks(m, x, heads, stage, in_flight, documents);
  const double whole = heads * x.T * x.T * x.s;
  const auto seq = static_cast<int64_t>(x.T);
  const double w = static_cast<double>(m.sliding_window);
  const double rows = m.sliding_window > 0 ? static_cast<double>(window_block_rows(m.sliding_window)) : 0;
  const double band = heads * rows * (rows + w) * x.s + (alibi ? heads * w * w * x.s : 0);
  const double parts = heads * (w * w + (x.T - w) * (rows + w)) * x.s;  // a sequence's, documents apart
  bool cached_parts = false, cached_windowed = false, cached_full = false;
  double bytes = 0;
  for (size_t c = 0; c < stage.chunks.size(); ++c) {
    const BlockRange& range = stage.chunks[c];
    const int64_t end = range.end < 0 ? m.n_layers : range.end;
    bool in_parts = false, windowed = false, full = false;  // windowed: the window's kind, attending in full
    for (int64_t layer = range.first; layer < end; ++layer) {
      if (window_leaves_out_keys(m, layer, seq))
        in_parts = true;
      else
        (attends_over_window(m, layer) ? windowed : full) = true;
    }
    cached_parts = cached_parts || in_parts;
    cached_windowed = cached_windowed || (windowed && alibi);
    cached_full = cached_full || (full && alibi);
    if (documents)
      bytes += static_cast<double>(in_flight[c]) * x.B *
               ((in_parts ? parts : 0) + whole * ((windowed ? 1 : 0) + (full ? 1 : 0)));
  }
  return bytes + (cached_parts && !documents ? band : 0) + whole * ((cached_windowed ? 1 : 0) + (cached_full ? 1 : 0));
}

struct Head {
  double saved = 0;          // final norm, the projection's input, the loss's gradients
  double forward_extra = 0;  // a chunk's logits being made beside what is saved
  double backward_extra = 0;
  double loss = 0;  // of `saved`: the gradients the loss made in its forward
};

Head head(const RankModel& r, int64_t tp, const Shape& x) {
  Head h;
  const double D = static_cast<double>(r.dim), V = static_cast<double>(r.vocab);
  h.saved = x.Nn * D * 4 + x.Nn * 4;  // the final norm
  h.saved += x.N * D * x.s;           // the projection's input, whole sequence
  const double bf16 = x.s < 4 ? 1.0 : 0.0;
  // linear_cross_entropy: the gradients of its input (compute dtype) and of the weight
  // (an fp32 sum over chunks), made in the forward and kept for backward.
  h.loss = x.N * D * x.s + V * D * 4;
  // A chunk's logits: in bf16 beside their fp32 log-probabilities, then those beside the
  // gradient cast back to bf16 (fp32 works in the one buffer); under bf16 also the
  // chunk's weight-gradient product before it joins the fp32 sum. On a GPU one kernel
  // turns the logits into their gradient in place, and cuBLAS adds the product into the
  // fp32 sum.
  const bool in_place = x.gpu_kernels && tp == 1;
  const double chunk = static_cast<double>(
      cross_entropy_chunk_rows(static_cast<int64_t>(x.N), r.vocab, in_place ? static_cast<int64_t>(x.s) : 4));
  if (in_place)
    h.forward_extra = chunk * V * x.s;
  else
    h.forward_extra = chunk * V * (bf16 > 0 ? 2 + 4 : 4) + bf16 * V * D * 2;
  // Backward scales the kept gradients in place (the weight's, fp32, is added into the
  // flat buffer). Under tensor parallelism the input's gradient is copied into the
  // all-reduce.
  h.backward_extra = tp > 1 ? x.N * D * x.s : 0;
  h.saved += h.loss;
  return h;
}

// ZeRO-2/3 (sharded_gradients.cpp): backward adds each unit's gradients into a buffer of
// its own; a complete unit's buffer goes to a reduce-scatter with the piece it returns
// and, through Gloo, a copy of its input; two stay in flight, and launching a third
// waits for the oldest only after the third's buffers exist. An untied head's unit goes
// first, as its backward ends; unit 0 (the embeddings) goes last, while the embedding's
// dense gradient, just added into it, is still alive; tied, unit 0 also holds the head and
// fills from the head's backward on. Walks one micro-batch's backward: the head's unit,
// then the blocks in reverse order, each block's saved tensors freed once its backward is
// done. Returns the most held at once beyond every saved tensor of the micro-batch but
// the head's (gone by a block's backward): in flight through an earlier micro-batch's end
// (`carried`, counted in `gathered` for the whole step, so taken off here), each unit's
// buffers, the block's own backward (`block_extra`) while it runs. `freed` is each
// block's saved bytes, in the order backward reaches them.
struct GradientUnits {
  double block = 0, unit0 = 0;  // a block's unit and unit 0, bytes of fp32
  double head = 0;              // the head's own unit (untied, last stage)
  double head_weight_gradient = 0;     // of the head's saved tensors, moved into its unit's buffer
  double head_saved = 0;               // the head's saved tensors, all alive when its unit launches
  bool unit0_fills_from_head = false;  // tied: unit 0's buffer lives through every block's backward
  double dp = 1;
  bool staged = false;            // Gloo copies a collective's input
  double embedding_gradient = 0;  // the first stage's dense gradient of the embedding
  // Tied embeddings on one stage: the head's weight gradient waits in autograd's buffer
  // until the embedding's joins it, through every block's backward.
  double tied_head_gradient = 0;
  double gathered_blocks_at_end = 0;  // ZeRO-3's gathered blocks, released by the end
};

double sharded_gradients_peak(const GradientUnits& g, const std::vector<double>& freed, double block_extra,
                              bool carried) {
  const auto job = [&](double buffer) { return buffer * (1 + 1 / g.dp + (g.staged ? 1 : 0)); };
  std::vector<double> in_flight;
  if (carried) in_flight = {job(g.block), job(g.unit0)};  // the previous micro-batch's block 0, then unit 0
  const auto total = [&] { return std::accumulate(in_flight.begin(), in_flight.end(), 0.0); };
  const double allowance = total();
  const auto held = [&] { return total() - allowance; };
  double peak = std::numeric_limits<double>::lowest();
  if (g.head > 0) {
    in_flight.push_back(job(g.head));
    peak = std::max(peak, held() + g.head_saved - g.head_weight_gradient);
    while (in_flight.size() > 2) in_flight.erase(in_flight.begin());
  }
  const double unit0_held = g.unit0_fills_from_head ? g.unit0 : 0;
  double gone = 0;
  for (const double saved : freed) {
    // The block's backward: unit 0's buffer, its own unit's, the collectives in flight.
    peak = std::max(peak, unit0_held + g.block + g.tied_head_gradient + held() + block_extra - gone);
    gone += saved;
    // Its unit launched beside the two in flight.
    in_flight.push_back(job(g.block));
    peak = std::max(peak, unit0_held + g.tied_head_gradient + held() - gone);
    while (in_flight.size() > 2) in_flight.erase(in_flight.begin());
  }
  in_flight.push_back(job(g.unit0));
  peak = std::max(peak, held() + g.embedding_gradient - g.gathered_blocks_at_end - gone);
  return peak;
}

struct StageMemory {
  MemoryEstimate m;
  std::vector<double> per_block;
};

StageMemory stage_memory(const RunConfig& cfg, const DeviceSpec& device, const PlanLayout& L, DType compute,
                         const PipelineStage& stage, int stage_index) {
  const ModelConfig& mc = cfg.model;
  const RankModel r = rank_model(mc, L.tp, stage, L.ep);
  // The dp x cp ranks hold the same parameters: ZeRO shards over them all. Under expert
  // parallelism a rank's experts are held by dp / ep of them, which shard those.
  const int replicas = L.replicas();
  const int holders = replicas / L.ep;
  const int64_t world = static_cast<int64_t>(replicas) * L.tp * L.pp;
  const int64_t pad = world > 1 ? replicas : 1;  // FlatParameters::Options::pad_to
  const double dense = static_cast<double>(r.padded_elements(pad));
  const double experts = static_cast<double>(r.expert_padded_elements(holders));
  const double P = dense + experts;
  const double piece = dense / replicas + experts / holders;
  const double unit0 = static_cast<double>(r.units(pad).front());
  // A block's unit: its flat buffers' (the rest's, and its experts' where apart).
  const double expert_unit = static_cast<double>(r.expert_block_unit(holders));
  const double block_unit = static_cast<double>(r.largest_block_unit(pad)) + expert_unit;
  const double head_unit = r.head_elements > 0 ? static_cast<double>(r.units(pad).back()) : 0.0;
  // ZeRO-3 keeps unit 0 whole through a micro-batch only where it is read after the lookup.
  const bool unit0_kept = parameter_unit_layout(mc).embeddings_read_after_lookup();
  StageMemory out;
  MemoryEstimate& m = out.m;

  m.parameters = (L.zero == 3 ? piece : P) * 4;
  m.gradients = (L.zero >= 2 ? piece : P) * 4;
  const double owned = L.zero >= 1 ? piece : P;
  if (L.offload) {
    m.host = 4 * owned * 4;  // moments, master and gradient copies
  } else {
    m.optimizer = 2 * owned * 4;
  }
  const bool bf16 = compute != DType::Float32;  // or fp16: the same widths
  // LoRA: the stage's frozen weights (this rank's slices) held whole over data
  // parallelism, or under ZeRO-3 in pieces as the adapters are (sharded_parameters.h:
  // frozen), beside its adapters, which alone have gradients and moments. Under bf16 the
  // frozen weights only ever multiplied are held in bf16 (parallelize.cpp: place_frozen),
  // under ZeRO-3 all its pieces (each gather rounds them alike).
  const double adapters = static_cast<double>(lora_rank_parameter_count(mc, L.tp, r.blocks));
  const double frozen_in_compute = bf16 ? static_cast<double>(r.blocks * (r.block_elements - r.block_widened) +
                                                              (mc.tie_embeddings ? 0 : r.head_matmul))
                                        : 0.0;
  if (mc.lora_rank > 0) {
    const double owned_adapters = L.zero >= 1 ? adapters / replicas : adapters;
    m.parameters =
        L.zero == 3 ? (P * (bf16 ? 2 : 4) + adapters * 4) / replicas : 4 * (P + adapters) - 2 * frozen_in_compute;
    m.gradients = (L.zero >= 2 ? adapters / replicas : adapters) * 4;
    if (L.offload)
      m.host = 4 * owned_adapters * 4;
    else
      m.optimizer = 2 * owned_adapters * 4;
  }
  // The blocks of each chunk that activation checkpointing recomputes (its first ones).
  ModelConfig checkpointed = mc;
  checkpointed.activation_checkpointing = L.activation_checkpointing;
  checkpointed.recompute_blocks = L.recompute_blocks;
  std::vector<double> recomputed;
  for (const auto& range : stage.chunks)
    recomputed.push_back(static_cast<double>(recomputed_blocks(checkpointed, range)));
  const double all_recomputed = std::accumulate(recomputed.begin(), recomputed.end(), 0.0);
  if (bf16) {
    // The bf16 working copies of the weights (compute_dtype.h). An optimizer that
    // updates every weight (no ZeRO sharding, no offload) writes a copy of the whole
    // flat buffer as it updates it (adamw.h: keep_working_copy). Otherwise the step keeps
    // every matmul weight's (ZeRO-1/2, offload). ZeRO-3's gathered units are their
    // weights' copies; only a tied head casts the embedding (fp32: the lookup reads it),
    // in forward and again in backward.
    const double matmul = L.zero != 3         ? static_cast<double>(r.blocks * r.block_matmul + r.head_matmul)
                          : mc.tie_embeddings ? static_cast<double>(r.head_matmul)
                                              : 0.0;
    m.working_copy = L.zero == 0 && !L.offload ? 2 * P : 2 * matmul;
    // LoRA: the adapters are cast by the optimizer, the frozen matmul weights held in
    // fp32 by the step (a tied head, key/value weights read whole).
    if (mc.lora_rank > 0) m.working_copy = 2 * (matmul - (L.zero == 3 ? 0.0 : frozen_in_compute) + adapters);
  }
  // ZeRO-3's gathered blocks: the running one (fp32; bf16: held in bf16, its norms and
  // biases widened to fp32 beside it) and the next one arriving (in fp32, or in the
  // compute dtype from this rank's piece cast for it, a piece of the rest's unit or of
  // its experts').
  const double block_widened = static_cast<double>(r.block_widened);
  const double gathered_blocks = bf16 ? block_unit * (2 + 2) + 2 * (block_unit - expert_unit) / replicas +
                                            2 * expert_unit / holders + 4 * block_widened
                                      : block_unit * (4 + 4);
  if (L.zero == 3) m.gathered += (unit0_kept ? unit0 * 4 : 0) + gathered_blocks;
  if (L.zero >= 2 && L.micro_batches > 1) {
    // The last two units a micro-batch's backward reduce-scatters (block 0 and unit 0)
    // stay in flight through the next micro-batch's forward: their gradient buffers, the
    // pieces they return and, through Gloo, its staging copy of the input. Under LoRA
    // unit 0 holds nothing trained, and a block's unit its adapters.
    const double staging = device.host ? 1.0 : 0.0;
    const double in_flight =
        mc.lora_rank > 0 ? adapters / static_cast<double>(std::max<int64_t>(r.blocks, 1)) : unit0 + block_unit;
    m.gathered += in_flight * 4 * (1.0 + 1.0 / replicas + staging);
  }

  Shape x;
  x.B = static_cast<double>(L.micro_batch);
  x.T = static_cast<double>(cfg.data.seq_len);
  x.cp = L.cp;
  x.by_heads = L.cp > 1 && L.cp_comm == "all_to_all";
  x.Q = x.T / L.cp;
  x.Tn = L.sequence_parallel ? x.Q / L.tp : x.Q;
  x.N = x.B * x.Q;
  x.Nn = x.B * x.Tn;
  x.s = bf16 ? 2.0 : 4.0;
  // Soft-capped attention (softcapped_attention.h) keeps what a fused kernel keeps, the
  // output and a log-sum-exp a row, on any device (a block's scores, up to 64 MiB fp32
  // and a few temporaries of its size, are not counted).
  x.fused_attention = device.fused_attention || mc.attention_softcap > 0;
  x.gpu_kernels = !device.host;
  const double D = static_cast<double>(r.dim);

  // Each of the stage's blocks' saved tensors, chunk after chunk (a windowed layer keeps
  // more than one attending in full); the most one keeps.
  std::vector<std::vector<double>> block_of(stage.chunks.size());
  // Blocks attending through unmasked_context_attention: any, and any kept whole (which
  // gathers the keys and values again in its backward).
  bool unmasked_context = false, regathered = false;
  for (size_t c = 0; c < stage.chunks.size(); ++c) {
    const int64_t end = stage.chunks[c].end < 0 ? mc.n_layers : stage.chunks[c].end;
    for (int64_t layer = stage.chunks[c].first; layer < end; ++layer) {
      const bool unmasked =
          L.cp > 1 && !x.by_heads && unmasked_context_layer(mc, layer, cfg.data.seq_len, cfg.data.document_attention);
      unmasked_context = unmasked_context || unmasked;
      regathered = regathered || (unmasked && static_cast<double>(layer - stage.chunks[c].first) >= recomputed[c]);
      block_of[c].push_back(block_saved(mc, r, x, window_leaves_out_keys(mc, layer, cfg.data.seq_len), unmasked));
    }
  }
  out.per_block.clear();
  for (const auto& chunk : block_of) out.per_block.insert(out.per_block.end(), chunk.begin(), chunk.end());
  const double one_block = *std::max_element(out.per_block.begin(), out.per_block.end());
  Head h;
  if (r.last) h = head(r, L.tp, x);
  // One micro-batch's saved tensors in each of the stage's chunks: every block's (or,
  // recomputed, each block's input) and the chunk's output held for the backward of a
  // later op. (A chunk's received activations are its first block's input, kept as they
  // are.) The model's first chunk keeps the token ids, its last the head's tensors.
  const size_t chunks = stage.chunks.size();
  std::vector<double> per_micro_batch(chunks), loss_of(chunks, 0.0);
  for (size_t c = 0; c < chunks; ++c) {
    const bool model_first = r.first && c == 0, model_last = r.last && c + 1 == chunks;
    double& saved = per_micro_batch[c];
    // The first `recomputed` blocks keep their input alone.
    const auto kept_whole = block_of[c].begin() + static_cast<std::ptrdiff_t>(recomputed[c]);
    saved = recomputed[c] * x.Nn * D * x.s + std::accumulate(kept_whole, block_of[c].end(), 0.0);
    if (!model_last) saved += x.Nn * D * x.s;
    if (model_first) saved += x.N * 8 * (L.tp > 1 ? 2 : 1);  // token ids kept by the lookup
    if (model_last) {
      saved += h.saved;
      loss_of[c] = h.loss;
    }
  }

  // Micro-batches in flight through each chunk at the stage's peak, walking its schedule:
  // 1F1B holds pp - stage (at most all of them), GPipe all, interleaved 1F1B up to
  // 2 (pp - stage - 1) + (V - 1) pp + 1 chunk-forwards.
  std::vector<int64_t> in_flight(chunks, 0), at_peak(chunks, 0);
  at_peak[0] = 1;
  if (L.pp > 1) {
    double held = 0, peak = -1;
    for (const PipelineOp& op :
         pipeline_schedule(L.schedule, stage_index, L.pp, L.micro_batches, static_cast<int>(chunks))) {
      const auto c = static_cast<size_t>(op.chunk);
      in_flight[c] += op.forward ? 1 : -1;
      held += op.forward ? per_micro_batch[c] : -per_micro_batch[c];
      if (held > peak) {
        peak = held;
        at_peak = in_flight;
      }
    }
  }
  for (size_t c = 0; c < chunks; ++c) {
    m.activations += static_cast<double>(at_peak[c]) * (per_micro_batch[c] - loss_of[c]);
    m.loss += static_cast<double>(at_peak[c]) * loss_of[c];
  }
  m.activations += attention_masks(mc, r, x, stage, at_peak, cfg.data.document_attention);

  // The widest moment of one micro-batch beyond its saved tensors: the loss being made,
  // the head's backward, or a block's backward, by when the head's saved tensors are
  // gone.
  double block_extra = block_backward_extra(mc, r, x, unmasked_context, regathered);
  // The recomputed block's own saved tensors; without masks under cp they include the
  // keys and values it gathered, which a recomputed block keeps.
  const double kept_gathered = unmasked_context ? gathered_keys_values(r, x) : 0.0;
  if (all_recomputed > 0) block_extra += one_block + kept_gathered;
  // ZeRO-2/3: beside it the gradient units' buffers and collectives, moment by moment
  // through backward (the head's saved tensors gone by then).
  double backward_extra = block_extra;
  if (L.zero >= 2) {
    // Each block's saved tensors, in the order backward frees them: chunks and their
    // blocks in reverse, a chunk's first blocks the recomputed ones.
    std::vector<double> freed;
    for (size_t c = chunks; c-- > 0;) {
      const auto blocks = static_cast<int64_t>(range_blocks(stage.chunks[c], mc.n_layers));
      for (int64_t b = blocks; b-- > 0;)
        freed.push_back(static_cast<double>(b) < recomputed[c] ? x.Nn * D * x.s : block_of[c][static_cast<size_t>(b)]);
    }
    GradientUnits g;
    g.block = block_unit * 4;
    g.unit0 = unit0 * 4;
    g.head = head_unit * 4;
    g.unit0_fills_from_head = r.last && mc.tie_embeddings;
    if (r.last) {
      g.head_saved = h.saved;
      g.head_weight_gradient = static_cast<double>(r.vocab) * D * 4;
    }
    g.dp = static_cast<double>(replicas);
    g.staged = device.host;
    if (r.first) g.embedding_gradient = static_cast<double>(r.vocab) * D * 4;
    if (r.first && r.last && mc.tie_embeddings) g.tied_head_gradient = g.embedding_gradient;
    if (L.zero == 3) g.gathered_blocks_at_end = gathered_blocks;
    backward_extra = sharded_gradients_peak(g, freed, block_extra, L.micro_batches > 1);
  }
  // ZeRO-3 from the loss through the head's backward: the last block (kept for its
  // backward) and the head's unit, not two blocks (under bf16 both held in bf16, their
  // norms widened beside them).
  double head_gathered = 0;
  if (L.zero == 3 && head_unit > 0) {
    const double head_widened = static_cast<double>(r.head_elements - r.head_matmul);
    head_gathered =
        (bf16 ? 2 * (block_unit + head_unit) + 4 * (block_widened + head_widened) : 4 * (block_unit + head_unit)) -
        gathered_blocks;
  }
  m.backward_transient =
      r.last ? std::max({h.forward_extra + head_gathered, h.backward_extra + head_gathered, backward_extra - h.saved})
             : backward_extra;
  // ZeRO-3: a micro-batch's forward starts with unit 0 gathered (under bf16 arriving in
  // bf16 and widened, both at once), then block 0's gather started beside it, before any
  // activation is made. Unit 0 kept for the step is counted in `gathered` already.
  if (L.zero == 3) {
    const double arriving = bf16 ? 2 + 2.0 / replicas : 0.0;
    const double start =
        unit0_kept ? unit0 * arriving
                   : std::max(unit0 * (4 + (bf16 ? 2 : 0)), unit0 * 4 + block_unit * (bf16 ? 2 + 2.0 / replicas : 4));
    m.backward_transient = std::max(m.backward_transient, start - gathered_blocks - m.activations - m.loss);
  }
  if (L.pp > 1) {
    const double wire = bf16 ? 2.0 : 4.0;
    m.communication = x.Nn * D * wire;  // the gradient or activation being received
  }
  // The asynchronous checkpoint's snapshot (checkpointer.cpp: the owned parameters and
  // both moments, copied to the host) overlaps the steps after a save.
  if (cfg.checkpoint.async && cfg.checkpoint.every > 0) m.checkpoint = 3 * owned * 4;
  double tensors = m.parameters + m.gradients + m.optimizer + m.working_copy + m.gathered + m.activations + m.loss +
                   m.backward_transient + m.communication;
  if (device.host) tensors += m.host + m.checkpoint;  // the CPU's device memory is the host's
  m.runtime = device.runtime_bytes + device.fragmentation * tensors;
  m.device = tensors + m.runtime;
  return out;
}

}  // namespace

MemoryEstimate estimate_memory(const RunConfig& cfg, const DeviceSpec& device, const PlanLayout& layout,
                               DType compute) {
  std::vector<PipelineStage> stages{PipelineStage{}};
  if (layout.pp > 1)
    stages = partition_stages(cfg.model, layout.pp, cfg.data.seq_len, cfg.parallel.pipeline_stages,
                              layout.virtual_stages, cfg.data.document_attention);
  MemoryEstimate worst;
  worst.device = -1;
  std::vector<double> by_stage;
  for (size_t s = 0; s < stages.size(); ++s) {
    StageMemory sm = stage_memory(cfg, device, layout, compute, stages[s], static_cast<int>(s));
    by_stage.push_back(sm.m.device);
    if (sm.m.device > worst.device) {
      worst = sm.m;
      worst.activations_by_block = std::move(sm.per_block);
      worst.peak_stage = static_cast<int>(s);
    }
  }
  worst.by_stage = std::move(by_stage);
  return worst;
}

}  // namespace tide::plan
