// The output projection and the cross-entropy loss as one autograd node that never holds
// the logits of every token at once.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "tide/engine/model/cross_entropy_chunks.h"

namespace tide {

class TensorParallelGroup;

// This rank's rows of a vocabulary split across tensor-parallel ranks: the weight's rows
// are the vocabulary's [first, first + rows), of which the first `valid` are real (padding
// follows). The softmax spans the group. A default VocabShard is the whole vocabulary.
struct VocabShard {
  TensorParallelGroup* group = nullptr;
  int64_t first = 0;
  int64_t valid = 0;
};

// A target that counts for nothing: no loss, no gradient, not in the mean (PyTorch's
// default ignore_index; data.eod_mask_loss writes it).
inline constexpr int64_t kUncountedTarget = -100;

// loss = mean_i -log softmax(h_i W^T)[t_i] over the rows whose target is counted (0 where
// none is), for h [N, D], W [V, D], targets [N] int64, in fp32 (fp64 for fp64 inputs)
// whatever the compute dtype.
//
// The rows go through in chunks of `chunk_rows` (0: cross_entropy_chunk_rows): a chunk's
// logits are made, reduced to the loss and, when a gradient is wanted, turned at once into
// the gradients of h and W, which are all the node keeps for backward (N x D and V x D,
// where the logits are N x V). The weight's gradient is summed over chunks in fp32. This
// is the fused linear cross-entropy of Liger-Kernel: the same three products as the
// unfused ops, none recomputed.
//
// logit_softcap > 0: the loss is of cap * tanh(h_i W^T / cap) (Gemma 2's final soft-cap),
// each chunk's tanh kept beside its logits for the gradient.
at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                const VocabShard& shard = {}, int64_t chunk_rows = 0, double logit_softcap = 0.0);

}  // namespace tide
