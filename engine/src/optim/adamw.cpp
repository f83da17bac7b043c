#include "tide/engine/optim/adamw.h"

#include <cmath>

#include <torch/torch.h>

#include "adamw_kernel.h"
#include "tide/engine/optim/flat_parameters.h"

namespace tide {

AdamW::AdamW(FlatParameters& params, const OptimConfig& cfg, int64_t begin, int64_t end)
    : params_(params), cfg_(cfg), begin_(begin), end_(end < 0 ? params.numel() : end) {
  TORCH_CHECK(0 <= begin_ && begin_ <= end_ && end_ <= params.numel(), "AdamW range [", begin_, ", ", end_,
              ") is outside the ", params.numel(), " parameters");
  m_ = torch::zeros({end_ - begin_}, params.data().options());
  v_ = torch::zeros({end_ - begin_}, params.data().options());
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++t_;
  auto& p = params_.data();
  const auto& g = params_.grad();
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const int64_t n_decay = params_.decay_numel();
  // The decayed prefix and the rest, each intersected with this optimizer's range.
  const std::pair<int64_t, int64_t> parts[2] = {{begin_, std::min(end_, n_decay)}, {std::max(begin_, n_decay), end_}};
  for (int k = 0; k < 2; ++k) {
    const auto [a, b] = parts[k];
    if (a >= b) continue;
    const double decay = k == 0 ? 1.0 - lr * cfg_.weight_decay : 1.0;
    auto pa = p.narrow(0, a, b - a), ga = g.narrow(0, a, b - a);
    auto ma = m_.narrow(0, a - begin_, b - a), va = v_.narrow(0, a - begin_, b - a);
    if (p.is_cpu() && p.scalar_type() == torch::kFloat32) {
      adamw_update_cpu(pa.data_ptr<float>(), ga.data_ptr<float>(), ma.data_ptr<float>(), va.data_ptr<float>(), b - a,
                       static_cast<float>(decay), static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                       static_cast<float>(cfg_.eps), static_cast<float>(lr / bc1),
                       static_cast<float>(1.0 / std::sqrt(bc2)));
      continue;
    }
    // Other devices: the same update from tensor ops, as torch.optim.AdamW computes it.
    pa.mul_(decay);
    ma.mul_(cfg_.beta1).add_(ga, 1.0 - cfg_.beta1);
    va.mul_(cfg_.beta2).addcmul_(ga, ga, 1.0 - cfg_.beta2);
    pa.addcdiv_(ma, va.sqrt().div_(std::sqrt(bc2)).add_(cfg_.eps), -lr / bc1);
  }
}

double clip_factor(double norm, double max_norm) {
  return max_norm > 0 && std::isfinite(norm) && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

double clip_grad_norm(torch::Tensor& grad, double max_norm) {
  torch::NoGradGuard no_grad;
  const double norm = grad.norm().item<double>();
  if (const double f = clip_factor(norm, max_norm); f != 1.0) grad.mul_(f);
  return norm;
}

}  // namespace tide
