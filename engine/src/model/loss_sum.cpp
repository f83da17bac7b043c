#include "tide/engine/model/loss_sum.h"

#include <ATen/ATen.h>

namespace tide {

void LossSum::add(const at::Tensor& loss) {
  const auto x = loss.detach().to(at::kDouble);
  sum_ = sum_.defined() ? sum_ + x : x;
}

at::Tensor LossSum::total(c10::Device device) const {
  return sum_.defined() ? sum_ : at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
}

}  // namespace tide
