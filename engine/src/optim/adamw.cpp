#include "tide/engine/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "adamw_kernel.h"
#include "tide/engine/optim/flat_parameters.h"

namespace tide {

AdamW::AdamW(FlatParameters& params, const OptimConfig& cfg, int64_t begin, int64_t end, bool offload)
    : params_(params), cfg_(cfg), begin_(begin), end_(end < 0 ? params.numel() : end) {
  TORCH_CHECK(0 <= begin_ && begin_ <= end_ && end_ <= params.numel(), "AdamW range [", begin_, ", ", end_,
              ") is outside the ", params.numel(), " parameters");
  const int64_t n = end_ - begin_;
  auto opts = params.data().options();
  if (offload) {
    opts = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU).pinned_memory(params.data().is_cuda());
    host_master_ = torch::empty({n}, opts);
    host_master_.copy_(params.data().narrow(0, begin_, n));
    host_grad_ = torch::empty({n}, opts);
  }
  m_ = torch::zeros({n}, opts);
  v_ = torch::zeros({n}, opts);
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++t_;
  const int64_t n = end_ - begin_;
  // Offloaded: the update runs on the host copies; otherwise on the flat buffers.
  torch::Tensor p = params_.data().narrow(0, begin_, n), g = params_.grad().narrow(0, begin_, n);
  if (host_master_.defined()) {
    host_grad_.copy_(g);
    p = host_master_;
    g = host_grad_;
  }
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const int64_t n_decay = std::clamp<int64_t>(params_.decay_numel() - begin_, 0, n);
  // The decayed prefix and the rest of this optimizer's range.
  const std::pair<int64_t, int64_t> parts[2] = {{0, n_decay}, {n_decay, n}};
  for (int k = 0; k < 2; ++k) {
    const auto [a, b] = parts[k];
    if (a >= b) continue;
    const double decay = k == 0 ? 1.0 - lr * cfg_.weight_decay : 1.0;
    auto pa = p.narrow(0, a, b - a), ga = g.narrow(0, a, b - a);
    auto ma = m_.narrow(0, a, b - a), va = v_.narrow(0, a, b - a);
    if (pa.is_cpu() && pa.scalar_type() == torch::kFloat32) {
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
  if (host_master_.defined()) params_.data().narrow(0, begin_, n).copy_(host_master_);
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
