// Calls back when autograd has accumulated a parameter's gradient for this backward
// pass (a post-hook on the parameter's AccumulateGrad node): the signal that lets
// gradient communication overlap the rest of backward.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "tide/engine/optim/flat_parameters.h"

namespace tide {

// A strong reference to a parameter's AccumulateGrad node: std::shared_ptr in PyTorch
// 2.4, c10::intrusive_ptr from 2.1x on.
using GradientNode = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
using GradientHooks = std::vector<GradientNode>;

// on_ready(slot index in flat.slots()). The returned nodes keep the hooks alive.
GradientHooks hook_gradient_ready(const FlatParameters& flat, std::function<void(size_t)> on_ready);

}  // namespace tide
