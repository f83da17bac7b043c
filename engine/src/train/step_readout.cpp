#include "step_readout.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace tide {

StepReadout::StepReadout(const StepValues& values, const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  const auto scale =
      values.loss_scale.defined() ? values.loss_scale.to(at::kDouble) : at::zeros_like(skip, at::kDouble);
  const auto packed =
      at::stack({values.loss.to(at::kDouble), values.grad_norm.to(at::kDouble), skip.to(at::kDouble), scale});
  if (packed.is_cpu()) {
    host_ = packed;
    return;
  }
  host_ = at::empty({4}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
  host_.copy_(packed, /*non_blocking=*/true);
  const c10::impl::VirtualGuardImpl device(packed.device().type());
  copied_.emplace(packed.device().type());
  copied_->record(device.getStream(packed.device()));
}

StepLoss StepReadout::read() const {
  if (copied_) copied_->synchronize();
  const double* v = host_.const_data_ptr<double>();
  return {v[0], v[1], v[2] != 0.0, v[3]};
}

}  // namespace tide
