// The output projection and the cross-entropy loss as one autograd node.
#pragma once

#include <ATen/core/Tensor.h>

namespace tide {

// loss = mean_i -log softmax(h_i W^T)[t_i], for h [N, D], W [V, D], targets [N] int64.
// One N x V buffer lives through forward and backward: the logits become log-probs in
// place, are saved, and turn into the gradient of the logits in place (exp, minus one at
// the target). The unfused ops keep the logits, the log-probs and two gradients of that
// size, and make about twice the passes over them.
at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets);

}  // namespace tide
