// What a training pass of a mixture-of-experts model shares between its loss and its
// blocks. Each block's load-balancing loss enters backward at the block's output (as
// Megatron-Core's MoEAuxLossAutoScaler does), so it reaches the router also from blocks
// recomputed in backward, whose forward built no graph; the weight it needs there, the
// gradient the pass's loss was given (its micro-batch's share of the step times any fp16
// loss scale), is recorded by the loss's own backward, which runs before any block's.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

namespace tide {

struct MoePass {
  // A scalar on the device: set by the loss's backward, or before the pass where the loss
  // is on another pipeline stage (TransformerImpl::set_moe_loss_gradient).
  at::Tensor loss_gradient;
  at::Tensor balance;  // the blocks' balances summed (no gradient)
  at::Tensor z;        // model.moe_z_loss: the blocks' mean(logsumexp(logits)^2) summed (no gradient)
  // model.moe_capacity_factor: the blocks' (token, choice) pairs, and those dropped.
  int64_t routed_pairs = 0, dropped_pairs = 0;
  // The (token, choice) pairs each expert of each layer got, [n_layers, E] float64 (the
  // layers of other pipeline stages 0); `layer` is the model layer whose block runs, set
  // before each block's first forward (a recomputation records nothing).
  at::Tensor loads;
  int64_t layer = 0;
};

// `loss` as it is; its backward records the gradient it is given in `pass`.
at::Tensor tap_moe_loss(const at::Tensor& loss, const std::shared_ptr<MoePass>& pass);

}  // namespace tide
