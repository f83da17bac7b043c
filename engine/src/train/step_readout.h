// A step's loss, gradient norm and skip flag brought to the host without stalling the
// device (internal): the copy is queued behind the step's work, and read once the host has
// queued the next step, so the device always has work while the host waits.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include "train_step.h"

namespace tide {

// What the host learns of a step.
struct StepLoss {
  double loss = 0;       // mean over the step's micro-batches and ranks
  double grad_norm = 0;  // global, before clipping; the same on every rank
  bool skipped = false;  // the update was skipped (as the device decided)
  double loss_scale = 0;  // fp16: the scale the step's backward used; 0 otherwise
  std::optional<double> moe_balance;   // model.moe_experts: StepValues::moe_balance
  std::optional<double> moe_max_load;  // model.moe_experts: StepValues::moe_max_load
  std::optional<double> moe_z;         // model.moe_z_loss: StepValues::moe_z
  std::optional<double> moe_dropped;   // model.moe_capacity_factor: StepValues::moe_dropped
};

class StepReadout {
 public:
  // Queues the copy of `values` and of the update's `skip` flag (a bool scalar).
  StepReadout(const StepValues& values, const at::Tensor& skip);
  // Waits for that copy only (not for later work on the device) and returns it.
  StepLoss read() const;

 private:
  at::Tensor host_;  // loss, norm, skip, loss scale, balance (-1: none) as fp64; pinned when copied from a GPU
  std::optional<c10::Event> copied_;  // recorded after the copy; none on the CPU
};

}  // namespace tide
