// How many rows the fused loss (linear_cross_entropy.h) takes at once. No LibTorch: the
// planner's memory model sizes the same chunks.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tide {

// Rows per chunk for `rows` positions against `vocab` weight rows, in multiples of 64 rows
// for the products. A chunk's three products (logits, the gradients of the input and of the
// weight) take 6 * rows FLOPs per weight element; the weight gradient's fp32 sum over chunks
// is read and written once a chunk, 8 bytes per weight element. On a GPU of today (an H200:
// about 770 TFLOP/s bf16, 4.5 TB/s) that sum costs about 230 / rows of the products' time:
// 8192 rows keep it under 3% (2048 rows, the chunk of a 128 MiB budget at a 32000-token
// vocabulary, paid 11%). Fewer rows where the logits would pass 512 MiB as the loss holds
// them, `bytes_per_logit` each (4 where it computes in fp32; the compute dtype's size where
// one kernel turns them into their gradient in place: bf16 on CUDA, 2): they are live at
// the top of the forward's memory, beside every layer's activations.
inline int64_t cross_entropy_chunk_rows(int64_t rows, int64_t vocab, int64_t bytes_per_logit = 4) {
  constexpr int64_t kTargetRows = 8192;
  constexpr int64_t kChunkBytes = int64_t{512} << 20;
  constexpr int64_t kRowMultiple = 64;
  const int64_t per_row = std::max<int64_t>(vocab, 1) * std::max<int64_t>(bytes_per_logit, 1);
  const int64_t fit = std::min(std::max<int64_t>(kChunkBytes / per_row, 1), kTargetRows);
  const int64_t rounded = fit >= kRowMultiple ? fit / kRowMultiple * kRowMultiple : fit;
  return std::clamp<int64_t>(rounded, 1, std::max<int64_t>(rows, 1));
}

}  // namespace tide
