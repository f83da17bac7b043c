// Causal attention of a chunk of queries that comes after other keys, without a mask:
// context parallelism's chunks (context_parallel.h) see every key before them and their
// own keys causally. LibTorch's fused kernels take "causal" only for queries and keys
// that start together, so such a chunk would need a dense [c, P + c] mask, which keeps the
// flash kernel out on CUDA and grows with the whole sequence (36 GB at 262,144 tokens over
// 8 ranks). Here the chunk is attended in two fused calls, the keys before it unmasked and
// its own keys causally, each returning its rows' log-sum-exp; the two outputs are merged
// exactly (weights exp(lse_part - lse)). Backward runs each part's fused backward with
// the merged output and log-sum-exp, which is what the backward of one attention over all
// the keys computes for that part's keys (as flash attention's backward recomputes each
// block's probabilities from the row's final log-sum-exp): the query gradients of the two
// parts sum, the key and value gradients are each part's own. Megatron-Core's and
// PyTorch's context parallelism merge their ring's steps the same way.
//
// Kernels: the host's flash kernel; CUDA's flash kernel for bf16 and fp16, its
// memory-efficient kernel for fp32 (compiled, not yet run on a GPU: docs/gpu.md). Grouped
// keys (K < H heads) are read in place, except by the memory-efficient kernel, which is
// given them repeated. No dropout: a part's dropped probabilities could not be drawn
// again in its backward.
//
// Shape legend: B batch, H query heads, K key/value heads, c the chunk's queries, P the
// keys before them, Hd head width.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tide {

// Whether chunk_attention has a fused kernel for these inputs (device, dtype, head width).
bool chunk_attention_supported(const at::Tensor& q);

// q [B, H, c, Hd], k and v [B, K, P + c, Hd]: query i sits at key P + i and sees the keys
// at or before it; softmax(scale q k^T) v, [B, H, c, Hd]. Differentiable in q, k and v.
at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

// chunk_attention without autograd, for a node that keeps other tensors for its backward
// than q, k and v (context_parallel.h: keys gathered again in backward). The forward's
// output, and what its backward needs beside q, k, v and that output: `saved` (the
// merged log-sum-exp and each kernel call's own state; entries may be undefined) and
// `sizes` (the kernel and the calls' lengths). No keys before the chunk (k as long as
// q) is one causal call.
struct ChunkAttentionForward {
  at::Tensor out;
  std::vector<at::Tensor> saved;
  std::vector<int64_t> sizes;
};
ChunkAttentionForward chunk_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              double scale);
// Given the output's gradient, adds those of k and v into grad_k and grad_v (k's shape: a
// node summing several chunks' gradients passes its own buffer's part) and returns q's;
// `saved` and `sizes` as chunk_attention_forward returned them for these q, k and v, `out`
// its output or a view of it.
at::Tensor chunk_attention_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const at::Tensor& out, const std::vector<at::Tensor>& saved,
                                    const std::vector<int64_t>& sizes, double scale, const at::Tensor& grad_k,
                                    const at::Tensor& grad_v);

}  // namespace tide
