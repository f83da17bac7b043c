#include "tide/engine/model/compute_dtype.h"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>

namespace tide {

namespace {
thread_local int weight_cast_scopes = 0;  // active WeightCastScopes on this thread

// Restores this thread's autocast settings (and clears its cache when asked) however the
// region ends.
class AutocastGuard {
 public:
  AutocastGuard(bool cpu, at::ScalarType cpu_dtype, bool cuda, at::ScalarType cuda_dtype, bool cache, bool clear)
      : cpu_(at::autocast::is_autocast_enabled(at::kCPU)),
        cuda_(at::autocast::is_autocast_enabled(at::kCUDA)),
        cache_(at::autocast::is_autocast_cache_enabled()),
        cpu_dtype_(at::autocast::get_autocast_dtype(at::kCPU)),
        cuda_dtype_(at::autocast::get_autocast_dtype(at::kCUDA)),
        clear_(clear) {
    set(cpu, cpu_dtype, cuda, cuda_dtype, cache);
  }
  ~AutocastGuard() {
    if (clear_) at::autocast::clear_cache();
    set(cpu_, cpu_dtype_, cuda_, cuda_dtype_, cache_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  static void set(bool cpu, at::ScalarType cpu_dtype, bool cuda, at::ScalarType cuda_dtype, bool cache) {
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache);
  }
  bool cpu_, cuda_, cache_;
  at::ScalarType cpu_dtype_, cuda_dtype_;
  bool clear_;
};
}  // namespace

at::Tensor with_compute_dtype(DType compute, const std::function<at::Tensor()>& fn) {
  if (compute != DType::BFloat16) return fn();
  // bf16 on the host and on CUDA devices alike (a device with no tensors in the region
  // is unaffected).
  const bool cache = c10::GradMode::is_enabled();
  AutocastGuard on(true, at::kBFloat16, true, at::kBFloat16, cache, cache && weight_cast_scopes == 0);
  return fn();
}

at::Tensor in_compute_dtype(const at::Tensor& x) {
  const auto device = x.device().type();
  if (!at::autocast::is_autocast_enabled(device)) return x;
  const auto dtype = at::autocast::get_autocast_dtype(device);
  return x.scalar_type() == dtype ? x : x.to(dtype);
}

WeightCastScope::WeightCastScope(bool active) : active_(active) {
  if (active_) ++weight_cast_scopes;
}

WeightCastScope::~WeightCastScope() {
  if (active_ && --weight_cast_scopes == 0) at::autocast::clear_cache();
}

AutocastState AutocastState::current() {
  AutocastState s;
  s.cpu_ = at::autocast::is_autocast_enabled(at::kCPU);
  s.cuda_ = at::autocast::is_autocast_enabled(at::kCUDA);
  s.cpu_dtype_ = at::autocast::get_autocast_dtype(at::kCPU);
  s.cuda_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
  return s;
}

at::Tensor AutocastState::run_uncached(const std::function<at::Tensor()>& fn) const {
  AutocastGuard as_then(cpu_, cpu_dtype_, cuda_, cuda_dtype_, /*cache=*/false, /*clear=*/false);
  return fn();
}

}  // namespace tide
