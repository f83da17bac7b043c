#include "recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "random_state.h"
#include "tide/engine/model/compute_dtype.h"

namespace tide {
namespace {

thread_local bool recomputing = false;

struct RecomputingScope {
  RecomputingScope() { recomputing = true; }
  ~RecomputingScope() { recomputing = outer; }
  RecomputingScope(const RecomputingScope&) = delete;
  RecomputingScope& operator=(const RecomputingScope&) = delete;
  const bool outer = recomputing;
};

struct FnHolder : torch::CustomClassHolder {
  FnHolder(BlockFn f, bool random) : fn(std::move(f)), draws_random(random) {}
  BlockFn fn;
  bool draws_random;
  std::vector<GeneratorState> rng;  // as the forward found them, when it draws
  AutocastState autocast;           // as the forward ran, so that the recomputation matches it
};

// Reentrant checkpoint: forward under no_grad, backward re-runs the function with the
// generator states it saw the first time (so dropout masks match; the device's own
// generator too, which CUDA draws them from) and backpropagates through the fresh
// graph, which accumulates parameter gradients as usual. The states are read only for
// a function that draws: a CUDA generator's state cannot be read during graph capture.
// Both runs use the compute dtype of the forward and none of autocast's cached casts: one
// made without gradients would be reused where they are needed, and backward may run on
// a device thread whose cache no step scope clears. tide's own nodes take the step's
// working copies (compute_dtype.h), which carry no gradient path and serve any thread.
struct Recompute : torch::autograd::Function<Recompute> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<FnHolder> holder) {
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    if (holder->draws_random) holder->rng = save_generators(x.device());
    ctx->save_for_backward({x});
    holder->autocast = AutocastState::current();
    torch::NoGradGuard no_grad;
    return holder->autocast.run_uncached([&] { return holder->fn(x); });
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule());
    const auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    std::vector<GeneratorState> rng_now;
    if (holder->draws_random) {
      rng_now = save_generators(x.device());
      restore_generators(holder->rng, x.device());
    }
    at::Tensor out;
    {
      torch::AutoGradMode enable(true);
      const RecomputingScope scope;
      out = holder->autocast.run_uncached([&] { return holder->fn(x); });
    }
    if (holder->draws_random) restore_generators(rng_now, x.device());
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

bool recomputing_for_backward() { return recomputing; }

at::Tensor recompute_in_backward(BlockFn fn, const at::Tensor& x, bool draws_random) {
  // An input that requires no gradient (the output of frozen embeddings under LoRA) would
  // leave the node unrecorded, and the block's trained parameters (its adapters) without
  // gradients: it is made a leaf that requires one, whose gradient nothing reads (Hugging
  // Face's enable_input_require_grads, for the same case).
  const auto in = x.requires_grad() ? x : x.detach().requires_grad_(true);
  return Recompute::apply(in, c10::make_intrusive<FnHolder>(std::move(fn), draws_random));
}

}  // namespace tide
