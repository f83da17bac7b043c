// Megatron-style tensor parallelism: this rank's share of the model, and the autograd
// functions that join the shares. Column-parallel linears split their output features
// (attention heads, MLP hidden units), row-parallel ones their input features; a pair
// needs one all-reduce forward and one backward. With sequence parallelism the
// activations between the pairs (norms, dropout, residuals) are split along the
// sequence instead of replicated, and the all-reduces become all-gathers and
// reduce-scatters of the same volume.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "tide/engine/config.h"

namespace tide {

class Comm;

struct TensorParallel {
  Comm* comm = nullptr;  // null: no tensor parallelism
  int rank = 0, size = 1;
  bool sequence_parallel = false;
};

// The vocabulary rounded up to a multiple of tp (each rank holds an equal slice; the
// padded rows are never looked up and their logits are masked out).
int64_t padded_vocab(int64_t vocab, int64_t tp);

// Forward identity, backward all-reduce (Megatron's f): before a column-parallel layer,
// and on a weight every rank holds whole but uses only partly.
at::Tensor copy_to_tp(const at::Tensor& x, Comm& tp);
// Forward all-reduce, backward identity (Megatron's g): after a row-parallel layer.
at::Tensor reduce_from_tp(const at::Tensor& x, Comm& tp);
// [B, T / tp, ...] → [B, T, ...]; backward reduce-scatters (sequence parallelism).
at::Tensor gather_sequence(const at::Tensor& x, Comm& tp);
// [B, T, ...] partial sums → [B, T / tp, ...] summed; backward all-gathers.
at::Tensor reduce_scatter_sequence(const at::Tensor& x, Comm& tp);

// Mean cross-entropy over rows of logits split by vocabulary: `logits` [N, V / tp] are
// this rank's columns [first, first + V / tp) of which the first `valid` are real
// (padding follows); targets [N] int64 in the whole vocabulary.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t first,
                                        int64_t valid, Comm& tp);

}  // namespace tide
