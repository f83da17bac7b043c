#include "tide/engine/optim/adamw.h"

#include <cmath>

#include <torch/torch.h>

#include "tide/engine/optim/flat_parameters.h"

namespace tide {

AdamW::AdamW(FlatParameters& params, const OptimConfig& cfg) : params_(params), cfg_(cfg) {
  m_ = torch::zeros_like(params.data());
  v_ = torch::zeros_like(params.data());
  denom_ = torch::empty_like(params.data());
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++t_;
  auto& p = params_.data();
  const auto& g = params_.grad();
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  if (cfg_.weight_decay > 0 && params_.decay_numel() > 0)
    p.narrow(0, 0, params_.decay_numel()).mul_(1.0 - lr * cfg_.weight_decay);
  m_.mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
  v_.mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
  // p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps), as torch.optim.AdamW computes it.
  torch::sqrt_out(denom_, v_).div_(std::sqrt(bc2)).add_(cfg_.eps);
  p.addcdiv_(m_, denom_, -lr / bc1);
}

double clip_grad_norm(torch::Tensor& grad, double max_norm) {
  torch::NoGradGuard no_grad;
  const double norm = grad.norm().item<double>();
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) grad.mul_(max_norm / (norm + 1e-6));
  return norm;
}

}  // namespace tide
