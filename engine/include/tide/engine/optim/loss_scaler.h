// Loss scaling for fp16 compute: the loss is multiplied by a scale before backward so
// that small gradients stay within fp16's range, and the update divides it out again.
// Dynamic scaling (precision.loss_scale = 0) halves the scale at a step whose gradients
// overflowed (that update is skipped: its global norm is not finite) and doubles it after
// loss_scale_window steps in a row without one, as PyTorch's GradScaler and DeepSpeed's
// dynamic loss scaler do. The scale stays on the device; nothing here waits for it.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "tide/engine/config.h"

namespace tide {

class LossScaler {
 public:
  // Active for compute = fp16 only (a resolved dtype); inert otherwise.
  LossScaler(const PrecisionConfig& precision, DType compute, const c10::Device& device);

  bool active() const { return scale_.defined(); }
  // The fp32 scalar on the device that multiplies the loss; undefined when inactive.
  const at::Tensor& scale() const { return scale_; }
  // After a step's update, from its scaled gradients' global norm (any floating scalar
  // on the device): halves the scale where the norm is not finite, counts a good step
  // otherwise and doubles the scale after `window` of them. Fixed scales stay.
  void update(const at::Tensor& scaled_norm);

  // For checkpoints: the scale and the good steps since it last changed (read from the
  // device), and their restoration.
  double value() const;
  int64_t good_steps() const;
  void restore(double scale, int64_t good_steps);

 private:
  at::Tensor scale_;   // fp32 scalar
  at::Tensor growth_;  // int32 scalar: good steps in a row
  bool dynamic_ = false;
  int64_t window_ = 1000;
};

}  // namespace tide
