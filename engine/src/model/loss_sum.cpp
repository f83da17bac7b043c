#include "tide/engine/model/loss_sum.h"

#include <ATen/ATen.h>

namespace tide {

void LossSum::add(const at::Tensor& loss) {
  const auto x = loss.detach().to(at::kDouble);
  sum_ = sum_.defined() ? sum_ + x : x;
}

double LossSum::value() const { return sum_.defined() ? sum_.item<double>() : 0.0; }

}  // namespace tide
