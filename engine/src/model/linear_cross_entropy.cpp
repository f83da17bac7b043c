#include "tide/engine/model/linear_cross_entropy.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace tide {
namespace {

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& targets) {
    at::Tensor logits = at::mm(h, weight.t());  // [N, V]
    if (logits.scalar_type() != at::kFloat && logits.scalar_type() != at::kDouble) logits = logits.to(at::kFloat);
    at::_log_softmax_out(logits, logits, 1, false);  // row-wise, in place: log-probs
    const at::Tensor loss = -logits.gather(1, targets.unsqueeze(1)).mean();
    ctx->save_for_backward({h, weight, targets, logits});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &weight = saved[1], &targets = saved[2];
    at::Tensor probs = saved[3];
    // d loss / d logits = (softmax - onehot(target)) / N, built in the saved buffer.
    probs.exp_();
    probs.scatter_add_(1, targets.unsqueeze(1), at::full({targets.size(0), 1}, -1.0, probs.options()));
    const at::Tensor scale = grads[0] / static_cast<double>(targets.size(0));
    const at::Tensor g = probs.to(h.scalar_type());
    at::Tensor grad_h = at::mm(g, weight.to(h.scalar_type())).mul_(scale);
    at::Tensor grad_w = at::mm(g.t(), h).to(weight.scalar_type()).mul_(scale);
    return {grad_h, grad_w, at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets) {
  // Under autocast the weight's working copy (cast once per step, its gradient flowing
  // back to the fp32 weight) enters the node: autocast inside it would cast the weight
  // with gradients off, every micro-batch.
  const auto device = weight.device().type();
  if (!at::autocast::is_autocast_enabled(device)) return LinearCrossEntropy::apply(h, weight, targets);
  const auto dtype = at::autocast::get_autocast_dtype(device);
  const auto w = at::autocast::cached_cast(dtype, weight, device);
  return LinearCrossEntropy::apply(h.to(w.scalar_type()), w, targets);
}

}  // namespace tide
