#include "tide/engine/optim/adamw.h"

#include <cmath>

#include <torch/torch.h>

#include "adamw_kernel.h"
#include "tide/engine/optim/flat_parameters.h"

namespace tide {

AdamW::AdamW(FlatParameters& params, const OptimConfig& cfg) : params_(params), cfg_(cfg) {
  m_ = torch::zeros_like(params.data());
  v_ = torch::zeros_like(params.data());
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++t_;
  auto& p = params_.data();
  const auto& g = params_.grad();
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const int64_t n_decay = params_.decay_numel();
  const double decay = 1.0 - lr * cfg_.weight_decay;
  if (p.is_cpu() && p.is_contiguous() && g.is_contiguous()) {
    const auto run = [&](int64_t b, int64_t e, double d) {
      adamw_update_cpu(p.data_ptr<float>(), g.data_ptr<float>(), m_.data_ptr<float>(), v_.data_ptr<float>(), b, e,
                static_cast<float>(d), static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                static_cast<float>(cfg_.eps), static_cast<float>(lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)));
    };
    run(0, n_decay, decay);
    run(n_decay, p.numel(), 1.0);
    return;
  }
  // Other devices: the same update from tensor ops.
  if (cfg_.weight_decay > 0 && n_decay > 0) p.narrow(0, 0, n_decay).mul_(decay);
  m_.mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
  v_.mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
  // p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps), as torch.optim.AdamW computes it.
  p.addcdiv_(m_, v_.sqrt().div_(std::sqrt(bc2)).add_(cfg_.eps), -lr / bc1);
}

double clip_grad_norm(torch::Tensor& grad, double max_norm) {
  torch::NoGradGuard no_grad;
  const double norm = grad.norm().item<double>();
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) grad.mul_(max_norm / (norm + 1e-6));
  return norm;
}

}  // namespace tide
