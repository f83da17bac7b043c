#include "tide/engine/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include <torch/types.h>

#include "adamw_kernel.h"
#include "model/cuda_kernel_args.h"
#include "tide/engine/model/compute_dtype.h"

namespace tide {
namespace {

// Whether tide's AdamW kernel can take t: a CUDA tensor in a build with the kernels (or
// a CPU one in the tests' emulation of them, cuda_kernel_args.h).
bool on_own_kernel_device(const torch::Tensor& t) {
#ifdef TIDE_LAUNCHES_KERNELS
  return on_kernel_device(t);
#else
  (void)t;
  return false;
#endif
}

}  // namespace

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
  TORCH_CHECK(!(offload && (kernel == AdamWKernel::fused || kernel == AdamWKernel::device)),
              "AdamW: offload runs the host kernel, not a device one");
  fused_ = kernel == AdamWKernel::fused || kernel == AdamWKernel::device ||
           (kernel == AdamWKernel::automatic && !offload && !params_.is_cpu());
  own_kernel_ =
      kernel == AdamWKernel::device || (kernel == AdamWKernel::automatic && fused_ && on_own_kernel_device(params_));
  TORCH_CHECK(!own_kernel_ || (on_own_kernel_device(params_) && on_own_kernel_device(grads_)),
              "AdamW: tide's kernel takes CUDA buffers in a build with tide's CUDA kernels; the parameters are on ",
              params_.device());
  if (fused_) {
    TORCH_CHECK(params_.scalar_type() == torch::kFloat32 && grads_.scalar_type() == torch::kFloat32,
                "AdamW: the fused kernel takes fp32 parameters and gradients");
    steps_ = torch::zeros({}, params_.options());
  }
  if (own_kernel_) {
    lay_out_kernel_ranges();
  } else if (fused_) {
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

AdamW::~AdamW() {
  if (working_.defined()) drop_working_copies(this);
}

bool AdamW::keep_working_copy(at::ScalarType dtype, const std::vector<FlatParameters::Slot>& slots) {
  TORCH_CHECK(dtype == torch::kBFloat16 || dtype == torch::kHalf, "AdamW: a working copy is bf16 or fp16, not ", dtype);
  if (host_master_.defined() || (fused_ && !own_kernel_)) return false;
  // Every slot must be a view of params() inside the segments this optimizer updates.
  std::vector<std::pair<int64_t, int64_t>> updated;  // [begin, end) in params()
  for (const auto& s : segments_) updated.emplace_back(s.param_offset, s.param_offset + s.numel);
  std::sort(updated.begin(), updated.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& r : updated) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  for (const auto& s : slots) {
    const auto it = std::upper_bound(merged.begin(), merged.end(), std::make_pair(s.offset, INT64_MAX));
    if (it == merged.begin() || std::prev(it)->second < s.offset + s.numel) return false;
    // By storage, not data pointer: a ZeRO-3 weight has no data between its gathers.
    if (!s.param.defined() || s.param.scalar_type() != torch::kFloat32 || s.offset + s.numel > params_.numel() ||
        !s.param.has_storage() || !s.param.storage().is_alias_of(params_.storage()) ||
        s.param.storage_offset() != params_.storage_offset() + s.offset)
      return false;
  }
  working_ = torch::empty({params_.numel()}, params_.options().dtype(dtype));
  working_slots_ = slots;
  offer_working_copy();
  return true;
}

void AdamW::offer_working_copy() {
  torch::NoGradGuard no_grad;
  working_.copy_(params_);
  std::vector<StandingCopy> copies;
  copies.reserve(working_slots_.size());
  for (const auto& s : working_slots_) copies.push_back({s.param, working_.narrow(0, s.offset, s.numel).view(s.shape)});
  keep_working_copies(this, params_, copies);
}

int64_t AdamW::steps_taken() const { return fused_ ? static_cast<int64_t>(steps_.item<float>()) : t_; }

void AdamW::restore(int64_t steps_taken) {
  torch::NoGradGuard no_grad;
  t_ = steps_taken;
  if (fused_) steps_.fill_(static_cast<double>(steps_taken));
  if (working_.defined()) offer_working_copy();
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
  const CopyElement copy = !working_.defined()                      ? CopyElement::none
                           : working_.scalar_type() == torch::kHalf ? CopyElement::f16
                                                                    : CopyElement::bf16;
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
    adamw_update_cpu(
        p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), s.numel, grad_factor,
        static_cast<float>(decay), static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
        static_cast<float>(cfg_.eps), static_cast<float>(lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
        copy == CopyElement::none ? nullptr
                                  : static_cast<char*>(working_.data_ptr()) + s.param_offset * working_.element_size(),
        copy);
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
  // Both kernels read the step count, which is ours to move, and write nothing where the
  // skip flag (PyTorch's found_inf) is set.
  std::optional<torch::Tensor> found_inf;
  steps_.add_(1);
  if (gate.skip.defined()) {
    found_inf = gate.skip.to(params_.device(), torch::kFloat32);
    steps_.sub_(*found_inf);
  }
  if (own_kernel_) {
    std::optional<torch::Tensor> factor;
    if (gate.clip.defined()) factor = gate.clip.to(params_.device(), torch::kFloat32);
    if constexpr (std::is_same_v<Lr, double>)
      own_kernel_step(torch::full({}, lr, params_.options()), factor, found_inf);
    else
      own_kernel_step(lr, factor, found_inf);
    return;
  }
  // PyTorch's fused AdamW divides the gradients by grad_scale (and leaves them so).
  std::optional<torch::Tensor> grad_scale;
  if (gate.clip.defined()) grad_scale = gate.clip.reciprocal().to(torch::kFloat32);
  for (auto& group : fused_groups_)
    at::_fused_adamw_(group.params, group.grads, group.exp_avg, group.exp_avg_sq, {}, group.steps, lr, cfg_.beta1,
                      cfg_.beta2, group.decayed ? cfg_.weight_decay : 0.0, cfg_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, grad_scale, found_inf);
}

// The ranges' 16-byte moves need every address they start at aligned: the buffers' own
// addresses decide, which a shard's view need not have at a multiple of 16 bytes. The
// working copy's four bf16 need the parameter offset a multiple of 4.
void AdamW::lay_out_kernel_ranges() {
#ifdef TIDE_LAUNCHES_KERNELS
  const auto aligned = [](const torch::Tensor& t, int64_t offset) {
    return reinterpret_cast<std::uintptr_t>(t.data_ptr<float>() + offset) % 16 == 0;
  };
  std::vector<kernels::AdamWRange> ranges;
  int64_t at = 0;
  for (const auto& s : segments_) {
    if (s.numel > 0)
      ranges.push_back({s.param_offset, s.grad_offset, at, s.numel, s.decayed,
                        s.param_offset % 4 == 0 && aligned(params_, s.param_offset) && aligned(grads_, s.grad_offset) &&
                            aligned(m_, at) && aligned(v_, at)});
    at += s.numel;
  }
  const auto n_ranges = static_cast<int64_t>(ranges.size());
  std::vector<kernels::AdamWChunk> chunks(static_cast<size_t>(kernels::adamw_chunks(ranges.data(), n_ranges, nullptr)));
  kernel_chunk_count_ = kernels::adamw_chunks(ranges.data(), n_ranges, chunks.data());
  const auto to_device = [&](const void* data, size_t bytes) {
    // A copy even on the host (the emulation's device): the vectors go with this call.
    return torch::from_blob(const_cast<void*>(data), {static_cast<int64_t>(bytes)}, torch::kUInt8)
        .to(params_.device(), /*non_blocking=*/false, /*copy=*/true);
  };
  kernel_ranges_ = to_device(ranges.data(), ranges.size() * sizeof(kernels::AdamWRange));
  kernel_chunks_ = to_device(chunks.data(), chunks.size() * sizeof(kernels::AdamWChunk));
  kernel_bases_ = {params_.data_ptr(), grads_.data_ptr()};
#endif
}

void AdamW::own_kernel_step(const torch::Tensor& lr, const std::optional<torch::Tensor>& grad_factor,
                            const std::optional<torch::Tensor>& skip) {
#ifdef TIDE_LAUNCHES_KERNELS
  // The buffers of a ZeRO shard may be made anew: the ranges' alignment is theirs.
  if (kernel_bases_ != std::make_pair<const void*, const void*>(params_.data_ptr(), grads_.data_ptr()))
    lay_out_kernel_ranges();
  kernels::AdamWArgs a;
  a.params = params_.data_ptr<float>();
  a.grads = grads_.data_ptr<float>();
  a.exp_avg = m_.data_ptr<float>();
  a.exp_avg_sq = v_.data_ptr<float>();
  if (working_.defined()) {
    a.working = working_.data_ptr();
    a.working_element = element_of(working_);
  }
  a.lr = lr.data_ptr<float>();
  a.step = steps_.data_ptr<float>();
  a.grad_factor = grad_factor ? grad_factor->data_ptr<float>() : nullptr;
  a.skip = skip ? skip->data_ptr<float>() : nullptr;
  a.beta1 = cfg_.beta1;
  a.beta2 = cfg_.beta2;
  a.eps = cfg_.eps;
  a.weight_decay = cfg_.weight_decay;
  kernels::adamw_update(a, reinterpret_cast<const kernels::AdamWRange*>(kernel_ranges_.data_ptr()),
                        reinterpret_cast<const kernels::AdamWChunk*>(kernel_chunks_.data_ptr()), kernel_chunk_count_,
                        stream_of(params_));
#else
  (void)lr;
  (void)grad_factor;
  (void)skip;
  TORCH_CHECK(false, "AdamW: this build has no CUDA kernels of tide's");
#endif
}

}  // namespace tide
