#include "tide/engine/model/micro_batch_losses.h"

#include <ATen/ATen.h>

namespace tide {

MicroBatchLosses::MicroBatchLosses(int64_t micro_batches) : micro_batches_(micro_batches) {}

MicroBatchLosses::MicroBatchLosses(const at::Tensor& counted, const at::Tensor& step_counted, int64_t ranks)
    : micro_batches_(counted.numel()) {
  // No counted target in the whole step: every part is 0 (each loss is, by its mean).
  shares_ = counted.to(at::kDouble).mul(static_cast<double>(ranks)).div_(step_counted.to(at::kDouble).clamp_min(1.0));
}

at::Tensor MicroBatchLosses::part(const at::Tensor& loss, int64_t m) {
  if (!shares_.defined()) {
    // The sum of the losses as they are, divided once at the end, as the host would.
    const auto x = loss.detach().to(at::kDouble);
    sum_ = sum_.defined() ? sum_ + x : x;
    return loss / static_cast<double>(micro_batches_);
  }
  const auto x = loss.to(at::kDouble) * shares_[m];
  sum_ = sum_.defined() ? sum_ + x.detach() : x.detach();
  return x;
}

at::Tensor MicroBatchLosses::share(int64_t m, c10::Device device) const {
  if (shares_.defined()) return shares_[m];
  return at::full({}, 1.0 / static_cast<double>(micro_batches_), at::TensorOptions().dtype(at::kDouble).device(device));
}

at::Tensor MicroBatchLosses::total(c10::Device device) const {
  if (!sum_.defined()) return at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  return shares_.defined() ? sum_ : sum_ / static_cast<double>(micro_batches_);
}

}  // namespace tide
