#include "tide/engine/optim/loss_scaler.h"

#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace tide {

LossScaler::LossScaler(const PrecisionConfig& precision, DType compute, const c10::Device& device)
    : dynamic_(precision.loss_scale == 0), window_(precision.loss_scale_window) {
  if (compute != DType::Float16) return;
  const double initial = dynamic_ ? precision.initial_loss_scale : precision.loss_scale;
  scale_ = at::full({}, initial, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_ = at::zeros({}, at::TensorOptions().dtype(at::kInt).device(device));
}

void LossScaler::update(const at::Tensor& scaled_norm) {
  if (!active() || !dynamic_) return;
  at::NoGradGuard no_grad;
  const at::Tensor found_inf = at::isfinite(scaled_norm).logical_not().to(at::kFloat);
  at::_amp_update_scale_(scale_, growth_, found_inf, 2.0, 0.5, window_);
}

double LossScaler::value() const { return active() ? scale_.item<double>() : 0.0; }

int64_t LossScaler::good_steps() const { return active() ? growth_.item<int64_t>() : 0; }

void LossScaler::restore(double scale, int64_t good_steps) {
  if (!active()) return;
  if (!(scale > 0) || good_steps < 0)
    throw std::invalid_argument(fmt::format("loss scale {} after {} good steps cannot be restored", scale, good_steps));
  at::NoGradGuard no_grad;
  if (dynamic_) scale_.fill_(scale);
  growth_.fill_(good_steps);
}

}  // namespace tide
