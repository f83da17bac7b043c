// Calls back when autograd has accumulated a parameter's gradient for this backward
// pass (a post-hook on the parameter's AccumulateGrad node): the signal that lets
// gradient communication overlap the rest of backward.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <torch/csrc/autograd/function.h>

#include "tide/engine/optim/flat_parameters.h"

namespace tide {

// on_ready(slot index in flat.slots()). The returned nodes keep the hooks alive.
std::vector<std::shared_ptr<torch::autograd::Node>> hook_gradient_ready(const FlatParameters& flat,
                                                                        std::function<void(size_t)> on_ready);

}  // namespace tide
