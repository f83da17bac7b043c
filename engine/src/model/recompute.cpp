#include "recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "tide/engine/model/compute_dtype.h"

namespace tide {
namespace {

struct FnHolder : torch::CustomClassHolder {
  explicit FnHolder(BlockFn f) : fn(std::move(f)) {}
  BlockFn fn;
  AutocastState autocast;  // as the forward ran, so that the recomputation matches it
};

// Reentrant checkpoint: forward under no_grad, backward re-runs the function with the
// RNG state it saw the first time (so dropout masks match) and backpropagates through
// the fresh graph, which accumulates parameter gradients as usual. Both runs use the
// compute dtype of the forward and no cached weight copies: one made without gradients
// would be reused where they are needed, and backward may run on a device thread whose
// cache no step scope clears.
struct Recompute : torch::autograd::Function<Recompute> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<FnHolder> holder) {
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["rng"] = at::detail::getDefaultCPUGenerator().get_state();
    ctx->save_for_backward({x});
    holder->autocast = AutocastState::current();
    torch::NoGradGuard no_grad;
    return holder->autocast.run_uncached([&] { return holder->fn(x); });
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule());
    const auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    auto gen = at::detail::getDefaultCPUGenerator();
    const auto rng_now = gen.get_state();
    gen.set_state(ctx->saved_data["rng"].toTensor());
    at::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = holder->autocast.run_uncached([&] { return holder->fn(x); });
    }
    gen.set_state(rng_now);
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor recompute_in_backward(BlockFn fn, const at::Tensor& x) {
  return Recompute::apply(x, c10::make_intrusive<FnHolder>(std::move(fn)));
}

}  // namespace tide
