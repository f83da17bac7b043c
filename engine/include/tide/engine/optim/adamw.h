// AdamW (decoupled weight decay) over ranges of flat fp32 buffers.
#pragma once

#include <vector>

#include <torch/types.h>

#include "tide/engine/config.h"
#include "tide/engine/optim/flat_parameters.h"

namespace tide {

class AdamW {
 public:
  // Updates `segments` of the 1-D buffers `params` and `grads` (the whole model, or the
  // pieces a ZeRO rank owns); the moments are held for those elements only.
  // offload: an fp32 master copy of the segments and the moments live in host memory
  // (pinned when the parameters are on a GPU), the update runs there on the host's
  // cores, and the result is copied back to the parameters' device.
  AdamW(torch::Tensor params, torch::Tensor grads, std::vector<OptimSegment> segments, const OptimConfig& cfg,
        bool offload = false);
  // The whole of a FlatParameters.
  AdamW(FlatParameters& flat, const OptimConfig& cfg, bool offload = false);

  // One update with learning rate `lr` (weight decay, betas and eps from config()).
  void step(double lr);
  int64_t numel() const { return m_.numel(); }
  int64_t steps_taken() const { return t_; }
  // Bytes of optimizer state: the moments, and with offload the host master and
  // gradient copies.
  int64_t state_bytes() const;
  OptimConfig& config() { return cfg_; }

  torch::Tensor& exp_avg() { return m_; }
  torch::Tensor& exp_avg_sq() { return v_; }
  // The buffer of parameters it updates (segments' param_offset index it).
  torch::Tensor& params() { return params_; }
  // After a checkpoint was loaded into params() and the moments: the step count, and
  // with offload the host master copy taken again from params().
  void restore(int64_t steps_taken);

 private:
  torch::Tensor params_, grads_;
  std::vector<OptimSegment> segments_;
  OptimConfig cfg_;
  torch::Tensor m_, v_;
  torch::Tensor host_master_, host_grad_;  // offload only
  int64_t t_ = 0;
};

// Scales `grad` in place so its L2 norm is at most max_norm (0: no clipping); returns
// the norm before clipping.
double clip_grad_norm(torch::Tensor& grad, double max_norm);
// The factor that brings a gradient of L2 norm `norm` down to max_norm (1: unchanged).
double clip_factor(double norm, double max_norm);

}  // namespace tide
