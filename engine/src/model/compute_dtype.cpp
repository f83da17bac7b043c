#include "tide/engine/model/compute_dtype.h"

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>

namespace tide {

namespace {
thread_local WeightCastScope* innermost_scope = nullptr;  // this thread's, where active

uint32_t version_of(const at::Tensor& t) { return t.is_inference() ? 0 : t._version(); }

// The working copies the scopes and standing owners keep, found from any thread:
// backward runs on autograd's device threads, which hold no scope of their own.
struct KeptCopies {
  struct Copy {
    at::Tensor weight;  // held, so that its address names no other tensor while the copy lives
    at::Tensor copy;
    uint32_t version = 0;
    at::Tensor base;  // standing copies: the buffer the weight views, and its version then
    uint32_t base_version = 0;
    const void* owner = nullptr;  // the scope or the standing copies' owner

    bool current() const {
      return version == version_of(weight) && (!base.defined() || base_version == version_of(base));
    }
  };
  std::mutex mutex;
  std::map<std::pair<const c10::TensorImpl*, at::ScalarType>, Copy> by_weight;
};

// Never destroyed: an owner that outlives this file's statics (an optimizer held by an
// embedding program's own static) still drops its copies at exit.
KeptCopies& kept_copies() {
  static auto* k = new KeptCopies;
  return *k;
}

// Sets this thread's autocast settings and cache switch for a region, and restores them
// (clearing the cache first when asked) however the region ends.
class AutocastGuard {
 public:
  AutocastGuard(const AutocastState& to, bool cache, bool clear)
      : before_(AutocastState::current()), cache_before_(at::autocast::is_autocast_cache_enabled()), clear_(clear) {
    set(to, cache);
  }
  ~AutocastGuard() {
    if (clear_) at::autocast::clear_cache();
    set(before_, cache_before_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  static void set(const AutocastState& s, bool cache) {
    at::autocast::set_autocast_enabled(at::kCPU, s.cpu);
    at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, s.cuda);
    at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache);
  }
  AutocastState before_;
  bool cache_before_, clear_;
};
}  // namespace

DType resolve_compute_dtype(DType requested, const c10::Device& device) {
  if (requested != DType::Auto) return requested;
  return device.is_cuda() ? DType::BFloat16 : DType::Float32;
}

c10::ScalarType scalar_type_of(DType compute) {
  switch (compute) {
    case DType::Float32: return at::kFloat;
    case DType::BFloat16: return at::kBFloat16;
    case DType::Float16: return at::kHalf;
    case DType::Auto: break;
  }
  throw std::logic_error("scalar_type_of: precision.compute 'auto' was not resolved");
}

std::string host_bf16_instructions() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    bool amx = false, avx512 = false;
    for (std::string w; words >> w;) {
      amx = amx || w == "amx_bf16";
      avx512 = avx512 || w == "avx512_bf16";
    }
    return amx ? "amx_bf16" : avx512 ? "avx512_bf16" : "";  // the first core's flags speak for all
  }
  return "";
}

at::Tensor with_compute_dtype(DType compute, const std::function<at::Tensor()>& fn) {
  if (compute == DType::Auto) throw std::logic_error("with_compute_dtype: precision.compute 'auto' was not resolved");
  if (compute == DType::Float32) return fn();
  // On the host and on CUDA devices alike (a device with no tensors in the region is
  // unaffected).
  const bool cache = c10::GradMode::is_enabled();
  const c10::ScalarType dtype = scalar_type_of(compute);
  AutocastGuard on({true, true, dtype, dtype}, cache, cache);
  return fn();
}

at::Tensor in_compute_dtype(const at::Tensor& x) { return x.to(compute_dtype_for(x)); }

at::Tensor working_copy(const at::Tensor& weight, at::ScalarType dtype) {
  if (weight.scalar_type() == dtype) return weight;
  const auto cast = [&] {
    const at::NoGradGuard no_grad;
    return weight.to(dtype);
  };
  auto& kept = kept_copies();
  const auto key = std::make_pair(weight.unsafeGetTensorImpl(), dtype);
  {
    const std::lock_guard<std::mutex> lock(kept.mutex);
    const auto it = kept.by_weight.find(key);
    if (it != kept.by_weight.end() && it->second.current()) return it->second.copy;
  }
  if (!innermost_scope) return cast();
  auto copy = cast();
  keep_working_copies(innermost_scope, {}, {{weight, copy}});
  return copy;
}

void keep_working_copies(const void* owner, const at::Tensor& base, const std::vector<StandingCopy>& copies) {
  auto& kept = kept_copies();
  const std::lock_guard<std::mutex> lock(kept.mutex);
  for (const auto& c : copies) {
    TORCH_CHECK(c.copy.sizes() == c.weight.sizes() && c.copy.device() == c.weight.device(),
                "keep_working_copies: a copy of shape ", c.copy.sizes(), " for a weight of shape ", c.weight.sizes());
    KeptCopies::Copy entry;
    entry.weight = c.weight;
    entry.copy = c.copy;
    entry.version = version_of(c.weight);
    entry.base = base;
    entry.base_version = base.defined() ? version_of(base) : 0;
    entry.owner = owner;
    kept.by_weight[std::make_pair(c.weight.unsafeGetTensorImpl(), c.copy.scalar_type())] = std::move(entry);
  }
}

void drop_working_copies(const void* owner) {
  auto& kept = kept_copies();
  const std::lock_guard<std::mutex> lock(kept.mutex);
  for (auto it = kept.by_weight.begin(); it != kept.by_weight.end();)
    it = it->second.owner == owner ? kept.by_weight.erase(it) : std::next(it);
}

at::ScalarType compute_dtype_for(const at::Tensor& weight) {
  const auto device = weight.device().type();
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : weight.scalar_type();
}

WeightCastScope::WeightCastScope(bool active) : active_(active) {
  if (!active_) return;
  outer_ = innermost_scope;
  innermost_scope = this;
}

WeightCastScope::~WeightCastScope() {
  if (!active_) return;
  innermost_scope = outer_;
  drop_working_copies(this);
}

AutocastState AutocastState::current() {
  return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::is_autocast_enabled(at::kCUDA),
          at::autocast::get_autocast_dtype(at::kCPU), at::autocast::get_autocast_dtype(at::kCUDA)};
}

at::Tensor AutocastState::run_uncached(const std::function<at::Tensor()>& fn) const {
  AutocastGuard as_then(*this, /*cache=*/false, /*clear=*/false);
  return fn();
}

}  // namespace tide
