// The AdamW update of one contiguous fp32 range on the CPU, in a single pass.
#pragma once

#include <cstdint>

namespace tide {

// The element type of the weights' working copy an update also writes.
enum class CopyElement { none, bf16, f16 };

// p = p * decay - step_size * m' / (sqrt(v') * inv_sqrt_bc2 + eps), with
// m' = b1 m + (1 - b1) g' and v' = b2 v + (1 - b2) g'^2, g' = g * grad_factor (clipping),
// over n elements. `working`, unless `copy` is none: p' rounded to the copy's element (to
// nearest even, as a cast does), at the same index.
void adamw_update_cpu(float* p, const float* g, float* m, float* v, int64_t n, float grad_factor, float decay, float b1,
                      float b2, float eps, float step_size, float inv_sqrt_bc2, void* working = nullptr,
                      CopyElement copy = CopyElement::none);

}  // namespace tide
