#include "tide/engine/model/compute_dtype.h"

#include <ATen/autocast_mode.h>

namespace tide {

namespace {
// bf16 autocast on the host and on CUDA devices alike (a device with no tensors in the
// region is unaffected).
void set_bf16_autocast(bool on) {
  for (const auto device : {at::kCPU, at::kCUDA}) {
    at::autocast::set_autocast_enabled(device, on);
    if (on) at::autocast::set_autocast_dtype(device, at::kBFloat16);
  }
  if (!on) at::autocast::clear_cache();
}
}  // namespace

at::Tensor with_compute_dtype(DType compute, const std::function<at::Tensor()>& fn) {
  if (compute != DType::BFloat16) return fn();
  set_bf16_autocast(true);
  at::Tensor out;
  try {
    out = fn();
  } catch (...) {
    set_bf16_autocast(false);
    throw;
  }
  set_bf16_autocast(false);
  return out;
}

}  // namespace tide
