// The one merge step of byte-level BPE, shared by encoding and training (internal).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace tide {

// Every non-overlapping occurrence of `pair` in `syms`, left to right, becomes `id`.
void merge_pair(std::vector<int32_t>& syms, const std::pair<int32_t, int32_t>& pair, int32_t id);

}  // namespace tide
