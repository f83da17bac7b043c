// How many rows the fused loss (linear_cross_entropy.h) takes at once. No LibTorch: the
// planner's memory model sizes the same chunks.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tide {

// Rows per chunk for `rows` positions against `vocab` weight rows: a chunk's fp32 logits
// stay within 32 Mi elements (128 MiB), in multiples of 64 rows for the products. Small
// enough that the logits are a fraction of what the model holds; large enough that the
// weight gradient's sum over chunks costs little beside the chunks' products.
inline int64_t cross_entropy_chunk_rows(int64_t rows, int64_t vocab) {
  constexpr int64_t kChunkElements = int64_t{1} << 25;
  constexpr int64_t kRowMultiple = 64;
  const int64_t fit = std::max<int64_t>(kChunkElements / std::max<int64_t>(vocab, 1), 1);
  const int64_t rounded = fit >= kRowMultiple ? fit / kRowMultiple * kRowMultiple : fit;
  return std::clamp<int64_t>(rounded, 1, std::max<int64_t>(rows, 1));
}

}  // namespace tide
