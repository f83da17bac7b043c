#include "tide/engine/optim/adamw.h"

#include <cmath>

#include <torch/torch.h>

#include "adamw_kernel.h"

namespace tide {

AdamW::AdamW(FlatParameters& flat, const OptimConfig& cfg, bool offload)
    : AdamW(flat.data(), flat.grad(), flat.segments(), cfg, offload) {}

AdamW::AdamW(torch::Tensor params, torch::Tensor grads, std::vector<OptimSegment> segments, const OptimConfig& cfg,
             bool offload)
    : params_(std::move(params)), grads_(std::move(grads)), segments_(std::move(segments)), cfg_(cfg) {
  int64_t n = 0;
  for (const auto& s : segments_) {
    TORCH_CHECK(s.numel >= 0 && s.param_offset >= 0 && s.param_offset + s.numel <= params_.numel() &&
                    s.grad_offset >= 0 && s.grad_offset + s.numel <= grads_.numel(),
                "AdamW segment [", s.param_offset, ", +", s.numel, ") is outside the buffers of ", params_.numel(),
                " parameters and ", grads_.numel(), " gradients");
    n += s.numel;
  }
  auto opts = params_.options();
  if (offload) {
    opts = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU).pinned_memory(params_.is_cuda());
    host_master_ = torch::empty({n}, opts);
    host_grad_ = torch::empty({n}, opts);
    int64_t at = 0;
    for (const auto& s : segments_) {
      host_master_.narrow(0, at, s.numel).copy_(params_.narrow(0, s.param_offset, s.numel));
      at += s.numel;
    }
  }
  m_ = torch::zeros({n}, opts);
  v_ = torch::zeros({n}, opts);
}

void AdamW::restore(int64_t steps_taken) {
  torch::NoGradGuard no_grad;
  t_ = steps_taken;
  if (!host_master_.defined()) return;
  int64_t at = 0;
  for (const auto& s : segments_) {
    host_master_.narrow(0, at, s.numel).copy_(params_.narrow(0, s.param_offset, s.numel));
    at += s.numel;
  }
}

int64_t AdamW::state_bytes() const {
  auto bytes = [](const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
  return bytes(m_) + bytes(v_) + bytes(host_master_) + bytes(host_grad_);
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const bool offloaded = host_master_.defined();
  int64_t at = 0;  // position in the moments (and the host copies)
  for (const auto& s : segments_) {
    // Offloaded: the update runs on the host copies; otherwise on the buffers.
    torch::Tensor p = params_.narrow(0, s.param_offset, s.numel), g = grads_.narrow(0, s.grad_offset, s.numel);
    if (offloaded) {
      auto hg = host_grad_.narrow(0, at, s.numel);
      hg.copy_(g);
      p = host_master_.narrow(0, at, s.numel);
      g = hg;
    }
    auto m = m_.narrow(0, at, s.numel), v = v_.narrow(0, at, s.numel);
    const double decay = s.decayed ? 1.0 - lr * cfg_.weight_decay : 1.0;
    if (p.is_cpu() && p.scalar_type() == torch::kFloat32) {
      adamw_update_cpu(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), s.numel,
                       static_cast<float>(decay), static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                       static_cast<float>(cfg_.eps), static_cast<float>(lr / bc1),
                       static_cast<float>(1.0 / std::sqrt(bc2)));
    } else {
      // Other devices: the same update from tensor ops, as torch.optim.AdamW computes it.
      p.mul_(decay);
      m.mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
      v.mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
      p.addcdiv_(m, v.sqrt().div_(std::sqrt(bc2)).add_(cfg_.eps), -lr / bc1);
    }
    if (offloaded) params_.narrow(0, s.param_offset, s.numel).copy_(p);
    at += s.numel;
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
