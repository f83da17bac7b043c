// Context parallelism as the model sees it: the sequence of every sample is split over cp
// ranks, each holding 1 / cp of its tokens through the whole model, so activation memory
// per rank falls with cp (long-context training; Megatron-Core's and torchtitan's
// context parallelism).
//
// Causal attention makes late tokens cost more than early ones, so each rank holds two
// chunks of the 2 cp equal chunks of a sequence: chunk r and chunk 2 cp - 1 - r (rank 0
// the first and the last). Every rank then attends over the same number of scores.
//
// Attention all-gathers the keys and values of the whole sequence (one collective a
// layer, both in one tensor) and each rank attends its own queries over the keys before
// them; backward reduce-scatters the keys' and values' gradients. This is the all-gather
// form of context parallelism (Llama 3's), not a ring. Causal attention without a mask
// (unmasked_context_attention) keeps only the rank's own keys and values for backward and
// gathers them again there, as a ring sends them again in its backward: a layer keeps
// its own tokens' worth, not the whole sequence's. A mask (ALiBi, documents apart, a
// window) or attention dropout keeps the gathered ones.
//
// The all-to-all form (parallel.cp_comm = "all_to_all"; DeepSpeed-Ulysses, Megatron's
// cp_comm_type "a2a") exchanges heads for tokens instead: one all-to-all gives each rank
// the whole sequence's q, k and v for its 1 / cp of the heads, attention runs as in one
// process (any mask, window, ALiBi for those heads, dropout, soft cap), and a second
// all-to-all returns the output's heads for the rank's tokens. It sends (H + 2 K + H) L
// Hd (cp - 1) / cp values a layer forward, whatever cp, where the all-gather form sends
// 2 K L Hd (cp - 1); it needs H divisible by cp, and K too (or cp by K: the ranks whose
// query heads read one key/value head all receive it).
//
// Everything else in a block acts token by token, so it needs nothing: the weights are
// replicated over the cp ranks, which therefore reduce their gradients together with the
// data-parallel ranks (parallelize.h).
//
// Shape legend: B batch, T the whole sequence, L = T / cp this rank's tokens, c = T / (2
// cp) a chunk, K key/value heads, H query heads, Hd head width.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tide/engine/model/attention_masks.h"
#include "tide/engine/model/tensor_parallel.h"

namespace tide {

enum class ContextComm { AllGather, AllToAll };

struct ContextParallel {
  // The collectives between the cp ranks (the same interface tensor parallelism's ranks
  // join through); null: no context parallelism.
  std::shared_ptr<TensorParallelGroup> group;
  ContextComm comm = ContextComm::AllGather;

  int rank() const { return group ? group->rank() : 0; }
  int size() const { return group ? group->size() : 1; }
  // Attention split by heads over the ranks (the all-to-all form).
  bool by_heads() const { return group && comm == ContextComm::AllToAll; }
};

// The all-to-all form's share of `heads` (query or key/value heads of a layer on this
// tensor-parallel rank) that rank `rank` of `size` attends with: the first and the count.
// heads / size each where size divides them; else (size a multiple of heads) the one head
// its query heads read (config.h: context_heads_split says whether a layer's heads split).
struct HeadShare {
  int64_t first = 0, count = 0;
};
HeadShare context_head_share(int64_t heads, int rank, int size);

// [L] int64 on `device`: the positions in a sequence of t tokens of the tokens rank `rank`
// of `size` holds, in the order it holds them (its first chunk, then its second).
at::Tensor context_positions(int64_t t, int rank, int size, const at::Device& device);

// x's entries along `dim` (of length T) that this rank holds: x itself without context
// parallelism. Tokens, targets, positions, documents are cut by it.
at::Tensor context_slice(const at::Tensor& x, int64_t dim, const ContextParallel& cp);

// One chunk of this rank's queries: the rows [local_first, + part.rows) of its queries,
// at positions [part.first, + part.rows), attend over the keys [part.keys_first, +
// part.keys()) of the whole sequence (the queries their last rows, as attention_masks.h
// places them). part.blocks is 1; part.mask is undefined where the chunk attends
// causally to every key up to it (no window, documents or ALiBi): `attend` then runs it
// as chunk_attention.h does, without a mask.
struct ContextChunk {
  int64_t local_first = 0;
  WindowPart part;
};

struct ContextAttention {
  std::shared_ptr<TensorParallelGroup> group;
  int64_t t = 0;                     // the whole sequence
  at::Tensor positions;              // [L] int64: context_positions
  std::vector<ContextChunk> chunks;  // this rank's two
  at::TensorOptions options;         // the masks' dtype and device (where there are masks)

  // No chunk has a mask: causal attention over every key before each query.
  bool unmasked() const;
};

// This rank's attention over a sequence of t tokens (2 cp divides t): each chunk's keys
// are those before its last query, or with a window w > 0 the w before each query
// (window_for's window: only where it leaves keys out); with `documents` [B, T] a query
// sees only keys of its own document; with ALiBi's `slopes` [H] (undefined: none) the
// masks carry its bias. Masks in `options`' dtype.
ContextAttention context_attention_chunks(const ContextParallel& cp, int64_t t, int64_t window,
                                          const at::Tensor& documents, const at::Tensor& slopes,
                                          const at::TensorOptions& options);

// q [B, H, L, Hd] and k, v [B, K, L, Hd] of this rank's tokens (RoPE applied): the keys
// and values of every rank gathered, then each chunk attended through `attend`; returns
// [B, H, L, Hd]. Gradients reach this rank's k and v summed over every rank's queries.
at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const ContextAttention& context, const PartAttention& attend);

// context_attention of unmasked chunks (context.unmasked()), each as chunk_attention.h
// attends it (q's dtype and device have its kernels; no dropout, no soft cap), in one
// autograd node that keeps q, this rank's keys and values, the output and the rows'
// log-sum-exps, and gathers the keys and values again in backward. Inside a block
// recomputed for its backward (activation checkpointing) it keeps the gathered ones: that
// graph's backward follows at once.
at::Tensor unmasked_context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const ContextAttention& context, double scale);

// The all-to-all form's first exchange: q [B, H, L, Hd] and k, v [B, K, L, Hd] of this
// rank's tokens (RoPE applied) become the whole sequence's, in position order, for this
// rank's share of the heads (context_head_share): [B, H / cp, T, Hd] and [B, K', T, Hd].
// One collective; backward the reverse one (a key/value head's gradients summed over the
// ranks that read it).
struct SequenceHeads {
  at::Tensor q, k, v;
};
SequenceHeads sequence_of_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const ContextParallel& cp);

// The second: attention's output [B, H / cp, T, Hd] for this rank's heads becomes every
// head's for this rank's tokens, [B, H, L, Hd] over [B, L, H, Hd] memory (the output
// projection reads it as [B, L, H Hd] without a copy). Backward the reverse.
at::Tensor tokens_of_heads(const at::Tensor& out, const ContextParallel& cp);

}  // namespace tide
