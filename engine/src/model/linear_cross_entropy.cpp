#include "tide/engine/model/linear_cross_entropy.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>

#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>
#include <torch/version.h>

#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/fused_ops.h"
#include "tide/engine/model/tensor_parallel.h"
#include "weight_gradient.h"

namespace tide {
namespace {

struct Gradients {
  at::Tensor loss_sum;  // sum over rows, fp32 (fp64)
  at::Tensor h;         // d loss_sum / d h, undefined when not wanted
  at::Tensor weight;    // d loss_sum / d weight, fp32 (fp64)
};

// One chunk's logits [c, V] over the whole vocabulary: adds the rows' losses to
// `loss_sum` and, with `gradient`, returns d(rows' loss sum)/d logits = softmax -
// one_hot(target), made in the logits' buffer. `by_kernel` (CUDA): one kernel does it all
// in two passes over the logits, in their dtype, uncounted rows' gradients zeroed.
// Elsewhere the log-softmax is one fused op and uncounted rows keep their softmax (the
// caller zeroes what they would send on: a pass over [c, D], not [c, V]).
at::Tensor whole_vocabulary_rows(at::Tensor logits, const at::Tensor& targets, at::ScalarType sum_type,
                                 at::Tensor& loss_sum, bool gradient, bool by_kernel) {
  if (by_kernel) {
    loss_sum.add_(cross_entropy_rows_(logits, targets, gradient).sum());
    return gradient ? logits : at::Tensor();
  }
  at::Tensor log_probs;
  if (logits.scalar_type() == sum_type) {
    log_probs = at::_log_softmax_out(logits, logits, 1, false);
  } else {
    log_probs = logits.to(sum_type);
    at::_log_softmax_out(log_probs, log_probs, 1, false);
  }
  const auto uncounted = targets.eq(kUncountedTarget).unsqueeze(1);
  const auto index = targets.unsqueeze(1).masked_fill(uncounted, 0);
  loss_sum.sub_(log_probs.gather(1, index).masked_fill_(uncounted, 0.0).sum());
  if (!gradient) return {};
  auto& grad = log_probs.exp_();
  return grad.scatter_add_(1, index, uncounted.to(sum_type).sub_(1.0));
}

// The same over this rank's columns of a vocabulary split across the shard's group: the
// rows' maxima and sums (and the target's logit, held by one rank) are reduced over it.
// Padding columns take no part; the one-hot term is where this rank holds the target.
// Uncounted rows add no loss and keep their softmax, as whole_vocabulary_rows's.
at::Tensor shard_rows(at::Tensor logits, const at::Tensor& targets, const VocabShard& shard, at::ScalarType sum_type,
                      at::Tensor& loss_sum, bool gradient) {
  if (logits.scalar_type() != sum_type) logits = logits.to(sum_type);
  const int64_t rows = logits.size(1);
  if (shard.valid < rows)
    logits.narrow(1, shard.valid, rows - shard.valid).fill_(-std::numeric_limits<double>::infinity());
  const auto mine = targets.ge(shard.first).logical_and_(targets.lt(shard.first + shard.valid));
  const auto index = (targets - shard.first).clamp_(0, rows - 1).unsqueeze(1);
  auto target_logit = logits.gather(1, index).squeeze(1).masked_fill_(mine.logical_not(), 0.0);
  auto row_max = at::amax(logits, 1);
  shard.group->all_reduce_max(row_max, "cross-entropy max");
  logits.sub_(row_max.unsqueeze(1)).exp_();
  auto sum_and_target = at::stack({logits.sum(1), target_logit});
  shard.group->all_reduce_sum(sum_and_target, "cross-entropy sum and target logit");
  const auto sum = sum_and_target[0];
  loss_sum.add_((sum.log() + row_max - sum_and_target[1]).masked_fill_(targets.eq(kUncountedTarget), 0.0).sum());
  if (!gradient) return {};
  auto& grad = logits.div_(sum.unsqueeze(1));
  return grad.scatter_add_(1, index, mine.to(sum_type).neg_().unsqueeze(1));
}

Gradients chunked_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                const VocabShard& shard, int64_t chunk, double cap, bool want_h, bool want_weight) {
  const int64_t n = h.size(0);
  const auto sum_type = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Gradients out;
  out.loss_sum = at::zeros({}, h.options().dtype(sum_type));
  if (want_h) out.h = at::empty_like(h, at::MemoryFormat::Contiguous);
  // The first chunk's product is written, not added: no zeroing pass over [V, D] first
  // (zeros where there are no rows, so no chunk).
  if (want_weight)
    out.weight = n > 0 ? at::empty(weight.sizes(), weight.options().dtype(sum_type))
                       : at::zeros(weight.sizes(), weight.options().dtype(sum_type));
  const auto weight_t = weight.t();
  const bool backward = want_h || want_weight;
  // The logits' dtype and device are h's (an mm of h and its dtype's weight), and they
  // are contiguous: the kernel takes them whenever it takes h.
  const bool by_kernel = !shard.group && fused_kernels_take(h);
  for (int64_t first_row = 0; first_row < n; first_row += chunk) {
    const int64_t c = std::min(chunk, n - first_row);
    const auto hc = h.narrow(0, first_row, c);
    const auto tc = targets.narrow(0, first_row, c);
    at::Tensor logits = at::mm(hc, weight_t);
    // Soft-capped (Gemma 2): y = cap tanh(z / cap), whose slope 1 - tanh^2 is kept for
    // the gradient in a buffer of the chunk's own.
    at::Tensor squashed;
    if (cap > 0) {
      squashed = logits.mul_(1.0 / cap).tanh_();
      logits = squashed.mul(cap);
    }
    // Handed over, not kept: a bf16 chunk's logits are freed once widened (16 MiB of a
    // 2048-row chunk at a vocabulary of 4096, which parallel.plan_memory saw kept).
    at::Tensor grad = shard.group
                          ? shard_rows(std::move(logits), tc, shard, sum_type, out.loss_sum, backward)
                          : whole_vocabulary_rows(std::move(logits), tc, sum_type, out.loss_sum, backward, by_kernel);
    if (!backward) continue;
    if (cap > 0) grad.mul_(squashed.mul_(squashed).neg_().add_(1.0));
    const at::Tensor g = grad.to(h.scalar_type());
    // Rows whose gradient the kernel did not zero, weighed 1 counted and 0 uncounted on
    // their way into h's and the weight's gradients (exact: a product by 1 or 0).
    at::Tensor kept;
    if (!by_kernel) kept = tc.ne(kUncountedTarget).unsqueeze(1).to(h.scalar_type());
    if (want_h) {
      auto rows_of_h = out.h.narrow(0, first_row, c);
      at::mm_out(rows_of_h, g, weight);
      if (kept.defined()) rows_of_h.mul_(kept);
    }
    if (want_weight) add_product(out.weight, g.t(), kept.defined() ? hc * kept : hc, /*overwrite=*/first_row == 0);
  }
  return out;
}

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  // h in the compute dtype; weight as the model holds it, multiplied by its working copy
  // in h's dtype. The weight's gradient stays fp32 (fp64) to the flat buffer.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& targets, const VocabShard& shard, int64_t chunk, double cap, bool want_h,
                            bool want_weight) {
    auto g = chunked_cross_entropy(h, working_copy(weight, h.scalar_type()), targets, shard, chunk, cap, want_h,
                                   want_weight);
    // The mean over the counted rows; none counted: a loss of 0 and no gradient.
    const auto counted = targets.ne(kUncountedTarget).sum().to(g.loss_sum.scalar_type()).clamp_min_(1.0);
    ctx->save_for_backward({g.h, g.weight, weight, counted});
    return g.loss_sum.div_(counted);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto scale = grads[0] / saved[3];
    at::Tensor grad_h, grad_weight;
    if (saved[0].defined()) grad_h = saved[0].mul_(scale);
    // Into the flat buffer's .grad in one pass where it is there (scaled, not scaled and
    // then added by autograd: two passes over [V, D] fp32 fewer).
    if (saved[1].defined()) grad_weight = scaled_weight_gradient(saved[2], saved[1], scale);
    return {grad_h, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets,
                                const VocabShard& shard, int64_t chunk_rows, double logit_softcap) {
  TORCH_CHECK(logit_softcap >= 0, "linear_cross_entropy: a logit soft-cap of ", logit_softcap);
  TORCH_CHECK(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1),
              "linear_cross_entropy: h [N, D] and weight [V, D] expected, got ", h.sizes(), " and ", weight.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == h.size(0), "linear_cross_entropy: ", h.size(0),
              " rows of h and targets of shape ", targets.sizes());
  // Under autocast the node computes in the compute dtype with the weight's working copy
  // (autocast would cast the weight inside the node afresh every micro-batch).
  const auto hx = h.to(compute_dtype_for(weight));
  // The logits in their dtype where the kernel works on them in place (whole_vocabulary_rows).
  // A soft-cap keeps each chunk's tanh beside its logits.
  const int64_t bytes_per_logit =
      (!shard.group && fused_kernels_take(hx) ? hx.element_size() : 4) + (logit_softcap > 0 ? hx.element_size() : 0);
  const int64_t chunk =
      chunk_rows > 0 ? chunk_rows : cross_entropy_chunk_rows(h.size(0), weight.size(0), bytes_per_logit);
  const bool grad = at::GradMode::is_enabled();
  RECORD_FUNCTION("tide::linear_cross_entropy", std::vector<c10::IValue>({hx, weight, targets}));
  return LinearCrossEntropy::apply(hx, weight, targets, shard, chunk, logit_softcap, grad && hx.requires_grad(),
                                   grad && weight.requires_grad());
}

}  // namespace tide
