#include "step_readout.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace tide {

StepReadout::StepReadout(const StepValues& values, const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  const auto scale =
      values.loss_scale.defined() ? values.loss_scale.to(at::kDouble) : at::zeros_like(skip, at::kDouble);
  const auto balance = values.moe_balance.defined() ? values.moe_balance.to(at::kDouble).reshape({})
                                                    : at::full_like(skip, -1.0, at::kDouble);
  const auto max_load = values.moe_max_load.defined() ? values.moe_max_load.to(at::kDouble).reshape({})
                                                      : at::full_like(skip, -1.0, at::kDouble);
  const auto z =
      values.moe_z.defined() ? values.moe_z.to(at::kDouble).reshape({}) : at::full_like(skip, -1.0, at::kDouble);
  const auto dropped = values.moe_dropped.defined() ? values.moe_dropped.to(at::kDouble).reshape({})
                                                    : at::full_like(skip, -1.0, at::kDouble);
  const auto packed = at::stack({values.loss.to(at::kDouble), values.grad_norm.to(at::kDouble), skip.to(at::kDouble),
                                 scale, balance, max_load, z, dropped});
  if (packed.is_cpu()) {
    host_ = packed;
    return;
  }
  host_ = at::empty({packed.size(0)}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
  host_.copy_(packed, /*non_blocking=*/true);
  const c10::impl::VirtualGuardImpl device(packed.device().type());
  copied_.emplace(packed.device().type());
  copied_->record(device.getStream(packed.device()));
}

StepLoss StepReadout::read() const {
  if (copied_) copied_->synchronize();
  const double* v = host_.const_data_ptr<double>();
  StepLoss out{v[0], v[1], v[2] != 0.0, v[3], std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  if (v[4] >= 0) out.moe_balance = v[4];
  if (v[5] >= 0) out.moe_max_load = v[5];
  if (v[6] >= 0) out.moe_z = v[6];
  if (v[7] >= 0) out.moe_dropped = v[7];
  return out;
}

}  // namespace tide
