// Attention whose scores are soft-capped before the softmax (Gemma 2). No fused attention
// kernel of LibTorch takes a cap, so tide runs it a block of queries at a time in LibTorch
// ops, as flash attention does: the T x T scores are never held whole, only a block's.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace tide {

// B = batch, H = query heads, K = key/value heads (K divides H), T = queries, S = keys
// (T <= S: the queries are the last T of the keys' positions, as in a window's parts,
// attention_masks.h), Hd = head width. q [B, H, T, Hd], k and v [B, K, S, Hd]: each
// key/value head serves H / K query heads, read in place (not repeated). With
// s = scale * q k^T:
//   scores = cap * tanh(s / cap), then the mask, then softmax over the keys, then times v.
// `bias` undefined: causal; boolean [1 or B, 1, T, S] (true: may attend); or additive
// [1 or B, 1 or H, T, S] (ALiBi's, a window's: -inf where a query may not look). The cap
// and the softmax run in fp32 whatever q's dtype (as transformers' Gemma 2 does the
// softmax), the products in q's. Every mask tide makes is causal, so a block of queries
// reads only the keys up to its last one. Forward keeps the output and each row's log-sum-exp; backward
// makes each block's scores again. Under dropout (p > 0) the probabilities are dropped and
// the scores written out whole (autograd keeps them). Returns [B, H, T, Hd] in q's dtype.
// block_rows: queries a block (0: as many as keep a block's fp32 scores near 64 MiB).
at::Tensor softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                                double scale, double cap, double dropout, int64_t block_rows = 0);

}  // namespace tide
