#include "tide/engine/train/flops.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include <torch/cuda.h>
#include <torch/types.h>

#include "tide/engine/model/compute_dtype.h"

namespace tide {

namespace {
// The best FLOP/s of three n × n products after a warm-up one.
double time_products(int64_t n, const torch::TensorOptions& opts, const std::function<void()>& sync) {
  const auto a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
  auto c = torch::mm(a, b);  // warm-up
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    torch::mm_out(c, a, b);
    sync();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s);
  }
  return best;
}
}  // namespace

double measure_matmul_peak(const char* device, DType dtype) {
  torch::NoGradGuard no_grad;
  const auto opts = torch::TensorOptions().dtype(scalar_type_of(dtype)).device(torch::Device(device));
  const bool cuda = opts.device().is_cuda();
  // A GPU reaches its peak only on large products, and its work is asynchronous: time
  // between synchronisations, not around a copy back to the host.
  const auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  double best = 0;
  if (cuda) {
    for (const int64_t n : {4096, 8192}) best = std::max(best, time_products(n, opts, sync));
    return best;
  }
  // On the CPU the sizes double from 256 until the four products of one size take 0.4 s:
  // fp32, and bf16 on a CPU with bf16 instructions, reach 2048 in a second or two as
  // before; bf16 on a CPU without them (an AMD EPYC without AVX512-BF16 runs a scalar
  // GEMM, 0.8 GFLOP/s) stops at 512 after about a second instead of spending 4.5 minutes
  // at 2048.
  for (int64_t n = 256; n <= 2048; n *= 2) {
    const auto t0 = std::chrono::steady_clock::now();
    best = std::max(best, time_products(n, opts, sync));
    if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(400)) break;
  }
  return best;
}

}  // namespace tide
