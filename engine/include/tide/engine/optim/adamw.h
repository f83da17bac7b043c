// AdamW (decoupled weight decay) over a FlatParameters buffer.
#pragma once

#include <torch/types.h>

#include "tide/engine/config.h"

namespace tide {

class FlatParameters;

class AdamW {
 public:
  // Updates the elements [begin, end) of the flat buffers (end = -1: all of them); the
  // moments are held for that range only (ZeRO shards it across data-parallel ranks).
  // offload: an fp32 master copy of the range and the moments live in host memory
  // (pinned when the parameters are on a GPU), the update runs there on the host's
  // cores, and the result is copied back to the parameters' device.
  AdamW(FlatParameters& params, const OptimConfig& cfg, int64_t begin = 0, int64_t end = -1, bool offload = false);

  // One update with learning rate `lr` (weight decay, betas and eps from config()).
  void step(double lr);
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t steps_taken() const { return t_; }
  OptimConfig& config() { return cfg_; }

  torch::Tensor& exp_avg() { return m_; }
  torch::Tensor& exp_avg_sq() { return v_; }

 private:
  FlatParameters& params_;
  OptimConfig cfg_;
  torch::Tensor m_, v_;
  torch::Tensor host_master_, host_grad_;  // offload only
  int64_t begin_ = 0, end_ = 0;
  int64_t t_ = 0;
};

// Scales `grad` in place so its L2 norm is at most max_norm (0: no clipping); returns
// the norm before clipping.
double clip_grad_norm(torch::Tensor& grad, double max_norm);
// The factor that brings a gradient of L2 norm `norm` down to max_norm (1: unchanged).
double clip_factor(double norm, double max_norm);

}  // namespace tide
