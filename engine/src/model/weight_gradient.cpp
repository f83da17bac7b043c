#include "weight_gradient.h"

#include <atomic>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

namespace tide {

void add_product(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == acc.scalar_type()) {
    acc.addmm_(a, b);
    return;
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  // Builds whose addmm.dtype wants `self` in the inputs' dtype refuse the call, and every
  // later call takes the sum below.
  static std::atomic<bool> fp32_out{true};
  if (acc.is_cuda() && fp32_out.load(std::memory_order_relaxed)) {
    try {
      at::addmm_out(acc, acc, a, b, acc.scalar_type());
      return;
    } catch (const c10::Error&) {
      fp32_out.store(false, std::memory_order_relaxed);
    }
  }
#endif
  acc.add_(at::mm(a, b));
}

at::Tensor weight_gradient(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor grad = weight.is_leaf() ? weight.grad() : at::Tensor();
  // Not under create_graph (a gradient that is itself differentiated must be a new node's).
  if (grad.defined() && !at::GradMode::is_enabled() && !grad.requires_grad() &&
      grad.scalar_type() == weight.scalar_type() && grad.device() == weight.device() &&
      grad.sizes() == weight.sizes()) {
    add_product(grad, a, b);
    return {};
  }
  return a.mm(b).to(weight.scalar_type());
}

}  // namespace tide
