#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "model/moe_pass.h"
#include "recompute.h"
#include "tide/engine/model/transformer.h"

namespace tide {
namespace {

struct PassHolder : torch::CustomClassHolder {
  explicit PassHolder(std::shared_ptr<MoePass> p) : pass(std::move(p)) {}
  std::shared_ptr<MoePass> pass;
};

std::shared_ptr<MoePass> pass_of(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<PassHolder>(ctx->saved_data["pass"].toCapsule())->pass;
}

struct LossGradientTap : torch::autograd::Function<LossGradientTap> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& loss,
                            c10::intrusive_ptr<PassHolder> holder) {
    ctx->saved_data["pass"] = c10::IValue::make_capsule(std::move(holder));
    return loss;  // wrapped as a view of it, with this node as its gradient function
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    pass_of(ctx)->loss_gradient = grads[0].detach();
    return {grads[0], at::Tensor()};
  }
};

// The block's output as it is; backward also gives the block's load-balancing loss the
// gradient coef * the loss's.
struct BalanceLossGradient : torch::autograd::Function<BalanceLossGradient> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& out, const at::Tensor& balance,
                            double coef, c10::intrusive_ptr<PassHolder> holder) {
    ctx->saved_data["pass"] = c10::IValue::make_capsule(std::move(holder));
    ctx->saved_data["coef"] = coef;
    ctx->saved_data["options"] = c10::IValue(balance.scalar_type());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto pass = pass_of(ctx);
    const double coef = ctx->saved_data["coef"].toDouble();
    // Without the tapped loss (a backward from something else) the balance adds nothing.
    at::Tensor g;
    if (pass->loss_gradient.defined()) g = pass->loss_gradient.to(ctx->saved_data["options"].toScalarType()).mul(coef);
    return {grads[0], g, at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor tap_moe_loss(const at::Tensor& loss, const std::shared_ptr<MoePass>& pass) {
  return LossGradientTap::apply(loss, c10::make_intrusive<PassHolder>(pass));
}

MoeImpl::MoeImpl(const ModelConfig& cfg, const TensorParallel& tp)
    : top_k_(cfg.moe_top_k), normalize_(cfg.moe_normalize_top_k), aux_coef_(cfg.moe_aux_loss), tp_(tp) {
  TORCH_CHECK(!tp_.group || !tp_.sequence_parallel, "a mixture of experts under sequence parallelism");
  gate = register_module("gate", Projection(cfg.dim, cfg.moe_experts, false));
  experts = register_module("experts", torch::nn::ModuleList());
  ModelConfig expert = cfg;
  expert.moe_experts = 0;
  for (int64_t e = 0; e < cfg.moe_experts; ++e) experts->push_back(Mlp(expert, tp));
}

torch::Tensor MoeImpl::forward(const torch::Tensor& x, const std::shared_ptr<MoePass>& pass) {
  const int64_t d = x.size(-1), n_experts = static_cast<int64_t>(experts->size());
  const auto tokens = x.reshape({-1, d});  // [N, D]
  // The router in fp32 (or wider) whatever the compute dtype: its choices are discrete,
  // and a rounding that flips one changes the expert a token gets.
  const auto router = at::promote_types(tokens.scalar_type(), torch::kFloat32);
  const auto probs = torch::linear(tokens.to(router), gate->weight.to(router)).softmax(-1);
  auto [weights, chosen] = probs.topk(top_k_, -1);  // [N, k]
  if (normalize_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  // Every (token, choice) pair grouped by expert, in token order within each.
  const auto choices = chosen.reshape({-1});  // [N k]
  const auto order = choices.argsort(/*stable=*/true);
  const auto token_of = order.div(top_k_, "floor");
  const auto per_expert = choices.bincount(c10::nullopt, n_experts);  // [E]
  // Each expert's batch size, read by the host: dropless routing sizes the experts'
  // products by it (one wait for the device a block).
  const auto counts = per_expert.cpu();
  const auto* count = counts.data_ptr<int64_t>();
  // Under tensor parallelism each rank computes its columns' part of every expert's
  // output: the experts' input gradient, and that of the weights that combine the parts,
  // are parts too, summed over the ranks (copy_to); the router's own path is whole on
  // every rank.
  const bool parts = tp_.group != nullptr;
  const auto routed = (parts ? tp_.group->copy_to(tokens) : tokens).index_select(0, token_of);  // [N k, D]
  std::vector<torch::Tensor> outputs;
  int64_t start = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    // An expert no token chose runs on no rows all the same: its weights are in the graph,
    // and backward gives them a gradient of 0, as on every other data-parallel rank,
    // whose gradient reductions wait for every parameter of a bucket.
    auto& expert = experts->at<MlpImpl>(static_cast<size_t>(e));
    const auto rows = routed.narrow(0, start, count[e]);
    outputs.push_back(parts ? expert.forward_part(rows) : expert.forward(rows));
    start += count[e];
  }
  const auto expert_out = torch::cat(outputs);  // [N k, D]
  auto combine = weights.reshape({-1}).index_select(0, order).to(expert_out.scalar_type()).unsqueeze(1);
  if (parts) combine = tp_.group->copy_to(combine);
  auto out = torch::zeros({tokens.size(0), d}, expert_out.options()).index_add(0, token_of, expert_out * combine);
  if (parts) out = tp_.group->reduce_from(out);
  out = out.view(x.sizes());
  if (!pass) return out;
  // Load balance: E sum_e f_e P_e, f_e the share of the choices expert e got (counted,
  // no gradient), P_e its mean probability; 1 where both are uniform.
  const auto share = per_expert.to(router) / static_cast<double>(choices.size(0));
  const auto balance = (share * probs.mean(0)).sum() * static_cast<double>(n_experts);
  if (!recomputing_for_backward()) {  // the first forward records it, a recomputation does not again
    pass->balance = pass->balance.defined() ? pass->balance + balance.detach() : balance.detach();
  }
  if (aux_coef_ == 0 || !torch::GradMode::is_enabled()) return out;
  return BalanceLossGradient::apply(out, balance, aux_coef_, c10::make_intrusive<PassHolder>(pass));
}

}  // namespace tide
