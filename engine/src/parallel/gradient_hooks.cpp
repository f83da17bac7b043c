#include "gradient_hooks.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/types.h>

namespace tide {

namespace {
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(std::shared_ptr<std::function<void(size_t)>> f, size_t s) : on_ready(std::move(f)), slot(s) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    (*on_ready)(slot);
    return outputs;
  }
  std::shared_ptr<std::function<void(size_t)>> on_ready;
  size_t slot;
};
}  // namespace

GradientHooks hook_gradient_ready(const FlatParameters& flat, std::function<void(size_t)> on_ready) {
  auto shared = std::make_shared<std::function<void(size_t)>>(std::move(on_ready));
  GradientHooks nodes;
  for (size_t i = 0; i < flat.slots().size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(flat.slots()[i].param);
    TORCH_CHECK(acc, "parameter ", flat.slots()[i].name, " has no gradient accumulator");
    acc->add_post_hook(std::make_unique<ReadyHook>(shared, i));
    nodes.push_back(std::move(acc));
  }
  return nodes;
}

}  // namespace tide
