// Kept apart from LibTorch's headers so it can be compiled for vectorisation
// (-O3 -fno-math-errno -fopenmp-simd, see engine/CMakeLists.txt). One pass reads
// p, g, m, v and writes p, m, v; the composite of tensor ops makes about fifteen
// passes and needs a parameter-sized scratch buffer.
#include "adamw_kernel.h"

#include <cmath>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace tide {

void adamw_update_cpu(float* p, const float* g, float* m, float* v, int64_t n, float grad_factor, float decay, float b1,
                      float b2, float eps, float step_size, float inv_sqrt_bc2, void* working, CopyElement copy) {
  at::parallel_for(0, n, int64_t{1} << 15, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = g[i] * grad_factor;
      const float mi = b1 * m[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    }
    // The range just written is still in this core's cache.
    if (copy == CopyElement::bf16) {
      auto* w = static_cast<c10::BFloat16*>(working);
      for (int64_t i = lo; i < hi; ++i) w[i] = c10::BFloat16(p[i]);
    } else if (copy == CopyElement::f16) {
      auto* w = static_cast<c10::Half*>(working);
      for (int64_t i = lo; i < hi; ++i) w[i] = c10::Half(p[i]);
    }
  });
}

}  // namespace tide
