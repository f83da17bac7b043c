#include "tide/engine/optim/adamw.h"

#include <cmath>
#include <optional>
#include <vector>

#include <torch/types.h>

#include "adamw_kernel.h"

namespace tide {

UpdateGate gate_update(const torch::Tensor& norm, double max_norm, const torch::Tensor& skip) {
  torch::NoGradGuard no_grad;
  UpdateGate gate;
  const auto finite = torch::isfinite(norm);
  gate.skip = skip.defined() ? finite.logical_not().logical_or(skip) : finite.logical_not();
  if (max_norm > 0) gate.clip = torch::where(finite.logical_and(norm > max_norm), max_norm / (norm + 1e-6), 1.0);
  return gate;
}

AdamW::AdamW(FlatParameters& flat, const OptimConfig& cfg, bool offload, AdamWKernel kernel)
    : AdamW(flat.data(), flat.grad(), flat.segments(), cfg, offload, kernel) {}

AdamW::AdamW(torch::Tensor params, torch::Tensor grads, std::vector<OptimSegment> segments, const OptimConfig& cfg,
             bool offload, AdamWKernel kernel)
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
  TORCH_CHECK(!(offload && kernel == AdamWKernel::fused), "AdamW: offload runs the host kernel, not the fused one");
  fused_ = kernel == AdamWKernel::fused || (kernel == AdamWKernel::automatic && !offload && !params_.is_cpu());
  if (fused_) {
    TORCH_CHECK(params_.scalar_type() == torch::kFloat32 && grads_.scalar_type() == torch::kFloat32,
                "AdamW: the fused kernel takes fp32 parameters and gradients");
    steps_ = torch::zeros({}, params_.options());
    for (const bool decayed : {true, false}) {
      FusedGroup group;
      group.decayed = decayed;
      int64_t at = 0;
      for (const auto& s : segments_) {
        if (s.decayed == decayed && s.numel > 0) {
          group.params.push_back(params_.narrow(0, s.param_offset, s.numel));
          group.grads.push_back(grads_.narrow(0, s.grad_offset, s.numel));
          group.exp_avg.push_back(m_.narrow(0, at, s.numel));
          group.exp_avg_sq.push_back(v_.narrow(0, at, s.numel));
          group.steps.push_back(steps_);
        }
        at += s.numel;
      }
      if (!group.params.empty()) fused_groups_.push_back(std::move(group));
    }
  }
}

int64_t AdamW::steps_taken() const { return fused_ ? static_cast<int64_t>(steps_.item<float>()) : t_; }

void AdamW::restore(int64_t steps_taken) {
  torch::NoGradGuard no_grad;
  t_ = steps_taken;
  if (fused_) steps_.fill_(static_cast<double>(steps_taken));
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

void AdamW::step(double lr, const UpdateGate& gate) {
  torch::NoGradGuard no_grad;
  if (fused_) {
    fused_step(lr, gate);
    return;
  }
  // The host kernel reads the gate: free for CPU tensors; with offload from a GPU, the one
  // wait for the device in a step (the update needs the gradients on the host anyway).
  if (gate.skip.defined() && gate.skip.item<bool>()) return;
  const float grad_factor = gate.clip.defined() ? static_cast<float>(gate.clip.item<double>()) : 1.0f;
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
    adamw_update_cpu(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), s.numel,
                     grad_factor, static_cast<float>(decay), static_cast<float>(cfg_.beta1),
                     static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps), static_cast<float>(lr / bc1),
                     static_cast<float>(1.0 / std::sqrt(bc2)));
    if (offloaded) params_.narrow(0, s.param_offset, s.numel).copy_(p);
    at += s.numel;
  }
}

void AdamW::step(const torch::Tensor& lr, const UpdateGate& gate) {
  TORCH_CHECK(lr.defined(), "AdamW: the learning rate tensor is undefined");
  TORCH_CHECK(lr.numel() == 1 && lr.is_floating_point(),
              "AdamW: the learning rate must be a floating-point scalar tensor, got ", lr.scalar_type(), " of shape ",
              lr.sizes());
  if (!fused_) {
    step(lr.item<double>(), gate);
    return;
  }
  torch::NoGradGuard no_grad;
  fused_step(lr.to(params_.device(), torch::kFloat32).reshape({}), gate);
}

// Lr: a double (the kernel's argument) or an fp32 scalar tensor on the parameters' device.
template <typename Lr>
void AdamW::fused_step(const Lr& lr, const UpdateGate& gate) {
  // PyTorch's fused AdamW divides the gradients by grad_scale (and leaves them so) and
  // returns at once where found_inf is set; it reads the step count, which is ours to move.
  std::optional<torch::Tensor> grad_scale, found_inf;
  if (gate.clip.defined()) grad_scale = gate.clip.reciprocal().to(torch::kFloat32);
  steps_.add_(1);
  if (gate.skip.defined()) {
    found_inf = gate.skip.to(torch::kFloat32);
    steps_.sub_(*found_inf);
  }
  for (auto& group : fused_groups_)
    at::_fused_adamw_(group.params, group.grads, group.exp_avg, group.exp_avg_sq, {}, group.steps, lr, cfg_.beta1,
                      cfg_.beta2, group.decayed ? cfg_.weight_decay : 0.0, cfg_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, grad_scale, found_inf);
}

}  // namespace tide
