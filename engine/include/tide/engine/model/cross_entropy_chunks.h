// How many rows the fused loss (linear_cross_entropy.h) takes at once. No LibTorch: the
// planner's memory model sizes the same chunks.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tide {

// Rows per chunk for `rows` positions against `vocab` weight rows: a chunk's logits stay
// within 128 MiB as the loss holds them, `bytes_per_logit` each (4 where it computes in
// fp32; the compute dtype's size where one kernel turns them into their gradient in place:
// bf16 on CUDA, 2), in multiples of 64 rows for the products. Small enough that the
// logits are a fraction of what the model holds; large enough that the weight gradient's
// fp32 sum, read and written once a chunk (8 bytes per weight element), costs little
// beside the chunks' products.
inline int64_t cross_entropy_chunk_rows(int64_t rows, int64_t vocab, int64_t bytes_per_logit = 4) {
  constexpr int64_t kChunkBytes = int64_t{128} << 20;
  constexpr int64_t kRowMultiple = 64;
  const int64_t per_row = std::max<int64_t>(vocab, 1) * std::max<int64_t>(bytes_per_logit, 1);
  const int64_t fit = std::max<int64_t>(kChunkBytes / per_row, 1);
  const int64_t rounded = fit >= kRowMultiple ? fit / kRowMultiple * kRowMultiple : fit;
  return std::clamp<int64_t>(rounded, 1, std::max<int64_t>(rows, 1));
}

}  // namespace tide
