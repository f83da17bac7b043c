#include "weight_gradient.h"

#include <atomic>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

namespace tide {

void add_product(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, bool overwrite) {
  const double beta = overwrite ? 0.0 : 1.0;  // 0: acc is not read, NaNs in it included
  if (a.scalar_type() == acc.scalar_type()) {
    at::addmm_out(acc, acc, a, b, beta);
    return;
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  // Builds whose addmm.dtype wants `self` in the inputs' dtype refuse the call, and every
  // later call takes the sum below.
  static std::atomic<bool> fp32_out{true};
  if (acc.is_cuda() && fp32_out.load(std::memory_order_relaxed)) {
    try {
      at::addmm_out(acc, acc, a, b, acc.scalar_type(), beta);
      return;
    } catch (const c10::Error&) {
      fp32_out.store(false, std::memory_order_relaxed);
    }
  }
#endif
  if (overwrite)
    acc.copy_(at::mm(a, b));
  else
    acc.add_(at::mm(a, b));
}

namespace {

// The weight's .grad where a gradient may be summed straight into it: a leaf's, in the
// weight's own dtype, device and shape; not under create_graph (a gradient that is itself
// differentiated must be a new node's).
at::Tensor summable_grad(const at::Tensor& weight) {
  at::Tensor grad = weight.is_leaf() ? weight.grad() : at::Tensor();
  if (grad.defined() && !at::GradMode::is_enabled() && !grad.requires_grad() &&
      grad.scalar_type() == weight.scalar_type() && grad.device() == weight.device() && grad.sizes() == weight.sizes())
    return grad;
  return {};
}

}  // namespace

at::Tensor weight_gradient(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor grad = summable_grad(weight);
  if (grad.defined()) {
    add_product(grad, a, b);
    return {};
  }
  return a.mm(b).to(weight.scalar_type());
}

at::Tensor scaled_weight_gradient(const at::Tensor& weight, const at::Tensor& g, const at::Tensor& scale) {
  at::Tensor grad = summable_grad(weight);
  if (grad.defined() && g.scalar_type() == grad.scalar_type()) {
    grad.addcmul_(g, scale);
    return {};
  }
  return g.mul_(scale).to(weight.scalar_type());
}

}  // namespace tide
