#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

// The block's output as it is; backward also gives one of the block's auxiliary losses
// (load balance, router z-loss) the gradient coef * the loss's.
struct AuxiliaryLossGradient : torch::autograd::Function<AuxiliaryLossGradient> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& out, const at::Tensor& loss,
                            double coef, c10::intrusive_ptr<PassHolder> holder) {
    ctx->saved_data["pass"] = c10::IValue::make_capsule(std::move(holder));
    ctx->saved_data["coef"] = coef;
    ctx->saved_data["options"] = c10::IValue(loss.scalar_type());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto pass = pass_of(ctx);
    const double coef = ctx->saved_data["coef"].toDouble();
    // Without the tapped loss (a backward from something else) the auxiliary loss adds
    // nothing.
    at::Tensor g;
    if (pass->loss_gradient.defined()) g = pass->loss_gradient.to(ctx->saved_data["options"].toScalarType()).mul(coef);
    return {grads[0], g, at::Tensor(), at::Tensor()};
  }
};

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<TensorParallelGroup> g) : group(std::move(g)) {}
  std::shared_ptr<TensorParallelGroup> group;
};

// Rows exchanged between the expert-parallel ranks (send_rows[j] of them to rank j,
// recv_rows[i] from rank i); backward sends their gradients back the way they came.
struct ExchangeRows : torch::autograd::Function<ExchangeRows> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows,
                            const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                            c10::intrusive_ptr<GroupHolder> holder, const char* what) {
    auto out = holder->group->all_to_all_rows(rows.contiguous(), send_rows, recv_rows, what);
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(holder));
    ctx->saved_data["what"] = std::string(what);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto holder = c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule());
    const auto g = holder->group->all_to_all_rows(grads[0].contiguous(), ctx->saved_data["recv"].toIntVector(),
                                                  ctx->saved_data["send"].toIntVector(),
                                                  "gradients of " + ctx->saved_data["what"].toStringRef());
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::vector<int64_t> sums_of_chunks(const int64_t* values, int64_t chunks, int64_t each) {
  std::vector<int64_t> out(static_cast<size_t>(chunks), 0);
  for (int64_t i = 0; i < chunks * each; ++i) out[static_cast<size_t>(i / each)] += values[i];
  return out;
}
}  // namespace

at::Tensor tap_moe_loss(const at::Tensor& loss, const std::shared_ptr<MoePass>& pass) {
  return LossGradientTap::apply(loss, c10::make_intrusive<PassHolder>(pass));
}

MoeImpl::MoeImpl(const ModelConfig& cfg, const TensorParallel& tp, const ExpertParallel& ep)
    : n_experts_(cfg.moe_experts),
      top_k_(cfg.moe_top_k),
      n_layers_(cfg.n_layers),
      normalize_(cfg.moe_normalize_top_k),
      sigmoid_(cfg.moe_router == MoeRouterScore::Sigmoid),
      per_sequence_(cfg.moe_balance_scope == MoeBalanceScope::Sequence),
      drop_by_position_(cfg.moe_drop_policy == MoeDropPolicy::Position),
      routed_scale_(cfg.moe_routed_scale),
      groups_(cfg.moe_groups),
      group_top_k_(cfg.moe_group_top_k),
      z_coef_(cfg.moe_z_loss),
      capacity_factor_(cfg.moe_capacity_factor),
      aux_coef_(cfg.moe_aux_loss),
      tp_(tp),
      ep_(ep) {
  TORCH_CHECK(!tp_.group || !tp_.sequence_parallel, "a mixture of experts under sequence parallelism");
  TORCH_CHECK(n_experts_ % ep_.size() == 0, n_experts_, " experts do not divide among ", ep_.size(),
              " expert-parallel ranks");
  gate = register_module("gate", Projection(cfg.dim, cfg.moe_experts, false));
  // Not trained by gradients: a buffer, which the flat parameter buffers leave out and
  // weight files and checkpoints carry (parallelize places it on the model's device).
  if (cfg.moe_expert_bias) expert_bias = register_buffer("expert_bias", torch::zeros({n_experts_}, torch::kFloat32));
  // Named by their index in the block, whichever rank holds them (checkpoints and
  // initial values go by the name).
  auto held = register_module("experts", std::make_shared<torch::nn::Module>());
  ModelConfig expert = cfg;
  expert.moe_experts = 0;
  const int64_t local = n_experts_ / ep_.size();
  first_expert_ = ep_.rank() * local;
  for (int64_t e = first_expert_; e < first_expert_ + local; ++e)
    experts.emplace_back(held->register_module(std::to_string(e), Mlp(expert, tp)));
  if (cfg.moe_shared_ffn_dim > 0) {
    ModelConfig shared = expert;
    shared.ffn_dim = cfg.moe_shared_ffn_dim;
    shared_expert = register_module("shared_expert", Mlp(shared, tp));
    if (cfg.moe_shared_gate) shared_expert_gate = register_module("shared_expert_gate", Projection(cfg.dim, 1, false));
  }
}

torch::Tensor MoeImpl::expert_forward(size_t local, const torch::Tensor& rows) {
  // An expert no token chose runs on no rows all the same: its weights are in the graph,
  // and backward gives them a gradient of 0, as on every other data-parallel rank,
  // whose gradient reductions wait for every parameter of a bucket.
  auto& expert = *experts.at(local);
  return tp_.group ? expert.forward_part(rows) : expert.forward(rows);
}

torch::Tensor MoeImpl::experts_forward(const torch::Tensor& routed, const int64_t* count) {
  std::vector<torch::Tensor> outputs;
  if (!ep_.group) {
    int64_t start = 0;
    for (size_t e = 0; e < experts.size(); ++e) {
      outputs.push_back(expert_forward(e, routed.narrow(0, start, count[e])));
      start += count[e];
    }
    return torch::cat(outputs);
  }
  return dispatched_forward(routed, count);
}

torch::Tensor MoeImpl::dispatched_forward(const torch::Tensor& routed, const int64_t* count) {
  const int64_t ranks = ep_.size(), local = static_cast<int64_t>(experts.size());
  // What each rank sends this one for each of this rank's experts: chunk i of rank i's
  // batch sizes.
  const auto mine = torch::from_blob(const_cast<int64_t*>(count), {n_experts_}, torch::kInt64).clone();
  const auto theirs = ep_.group->all_to_all(mine, "expert batch sizes").to(torch::kCPU);  // [ranks, local]
  const int64_t* from = theirs.data_ptr<int64_t>();
  const auto send_rows = sums_of_chunks(count, ranks, local);
  const auto recv_rows = sums_of_chunks(from, ranks, local);
  const auto holder = c10::make_intrusive<GroupHolder>(ep_.group);
  // Arrived by source rank, each source's rows by expert: regrouped by expert (sources
  // in order within each), computed, and put back in arrival order to return.
  const auto arrived = ExchangeRows::apply(routed, send_rows, recv_rows, holder, "tokens sent to their experts");
  std::vector<int64_t> by_expert, source_start(static_cast<size_t>(ranks), 0);
  for (int64_t i = 1; i < ranks; ++i)
    source_start[static_cast<size_t>(i)] =
        source_start[static_cast<size_t>(i - 1)] + recv_rows[static_cast<size_t>(i - 1)];
  by_expert.reserve(static_cast<size_t>(arrived.size(0)));
  std::vector<int64_t> expert_rows(static_cast<size_t>(local), 0);
  for (int64_t k = 0; k < local; ++k) {
    for (int64_t i = 0; i < ranks; ++i) {
      int64_t at = source_start[static_cast<size_t>(i)];
      for (int64_t j = 0; j < k; ++j) at += from[i * local + j];
      for (int64_t r = 0; r < from[i * local + k]; ++r) by_expert.push_back(at + r);
      expert_rows[static_cast<size_t>(k)] += from[i * local + k];
    }
  }
  std::vector<int64_t> arrival(by_expert.size());
  for (size_t p = 0; p < by_expert.size(); ++p) arrival[static_cast<size_t>(by_expert[p])] = static_cast<int64_t>(p);
  const auto index = [&](const std::vector<int64_t>& v) { return torch::tensor(v, torch::kInt64).to(routed.device()); };
  const auto grouped = arrived.index_select(0, index(by_expert));
  std::vector<torch::Tensor> outputs;
  int64_t start = 0;
  for (int64_t k = 0; k < local; ++k) {
    outputs.push_back(
        expert_forward(static_cast<size_t>(k), grouped.narrow(0, start, expert_rows[static_cast<size_t>(k)])));
    start += expert_rows[static_cast<size_t>(k)];
  }
  const auto done = torch::cat(outputs).index_select(0, index(arrival));
  return ExchangeRows::apply(done, recv_rows, send_rows, holder, "expert outputs sent back");
}

torch::Tensor MoeImpl::forward(const torch::Tensor& x, const std::shared_ptr<MoePass>& pass) {
  const int64_t d = x.size(-1);
  const auto tokens = x.reshape({-1, d});  // [N, D]
  // The router in fp32 (or wider) whatever the compute dtype: its choices are discrete,
  // and a rounding that flips one changes the expert a token gets.
  const auto router = at::promote_types(tokens.scalar_type(), torch::kFloat32);
  const auto logits = torch::linear(tokens.to(router), gate->weight.to(router));
  const auto scores = sigmoid_ ? logits.sigmoid() : logits.softmax(-1);  // [N, E]
  at::Tensor weights, chosen;                                            // [N, k]
  if (expert_bias.defined() || groups_ > 1) {
    // The bias and the groups steer the choice alone: the chosen experts weigh by their
    // own scores.
    chosen = std::get<1>(choice_scores(scores.detach()).topk(top_k_, -1));
    weights = scores.gather(-1, chosen);
  } else {
    std::tie(weights, chosen) = scores.topk(top_k_, -1);
  }
  if (normalize_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  if (routed_scale_ != 1.0) weights = weights * routed_scale_;
  // Every (token, choice) pair grouped by expert, in token order within each (by weight,
  // highest first, where a capacity drops the lowest).
  const auto choices = chosen.reshape({-1});  // [N k]
  const int64_t pairs = choices.size(0);
  const int64_t capacity = is_training() && capacity_factor_ > 0
                               ? static_cast<int64_t>(std::ceil(capacity_factor_ * static_cast<double>(pairs) /
                                                                static_cast<double>(n_experts_)))
                               : pairs;
  at::Tensor order;
  if (capacity < pairs && !drop_by_position_) {
    const auto by_weight = weights.detach().reshape({-1}).argsort(/*stable=*/true, 0, /*descending=*/true);
    order = by_weight.index_select(0, choices.index_select(0, by_weight).argsort(/*stable=*/true));
  } else {
    order = choices.argsort(/*stable=*/true);
  }
  const auto per_expert = choices.bincount(c10::nullopt, n_experts_);  // [E], before any drop
  // Each expert's batch size, read by the host: dropless routing sizes the experts'
  // products by it (one wait for the device a block).
  const auto counts = per_expert.cpu();
  at::Tensor kept;  // [N k] in the pairs' order, bool: where a capacity dropped some
  const int64_t* count = counts.data_ptr<int64_t>();
  std::vector<int64_t> capped;
  if (capacity < *std::max_element(count, count + n_experts_)) {
    // Each pair's place among its expert's (in `order`): those from `capacity` on drop.
    const auto starts = per_expert.cumsum(0) - per_expert;
    const auto rank = torch::arange(pairs, order.options()) - starts.index_select(0, choices.index_select(0, order));
    const auto keep_sorted = rank < capacity;
    kept = torch::empty_like(keep_sorted).scatter_(0, order, keep_sorted);
    order = order.masked_select(keep_sorted);
    for (int64_t e = 0; e < n_experts_; ++e) capped.push_back(std::min(count[e], capacity));
    count = capped.data();
  }
  if (pass && capacity_factor_ > 0 && !recomputing_for_backward()) {
    pass->routed_pairs += pairs;
    pass->dropped_pairs += pairs - order.size(0);
  }
  const auto token_of = order.div(top_k_, "floor");
  // Under tensor parallelism each rank computes its columns' part of every expert's
  // output: the experts' input gradient, and that of the weights that combine the parts,
  // are parts too, summed over the ranks (copy_to); the router's own path is whole on
  // every rank.
  const bool parts = tp_.group != nullptr;
  const auto routed = (parts ? tp_.group->copy_to(tokens) : tokens).index_select(0, token_of);  // [N k, D]
  const auto expert_out = experts_forward(routed, count);                                       // [N k, D]
  // Back in token order, each token's k outputs weighted and summed: the product keeps
  // the outputs once for backward (an index_add of the weighted rows would keep them
  // twice, its source beside the product's input). A dropped pair reads row 0 at weight
  // 0: it adds nothing, and its weight and that row get no gradient from it.
  const auto position = kept.defined() ? torch::zeros({pairs}, order.options()) : torch::empty_like(order);
  position.scatter_(0, order, torch::arange(order.size(0), order.options()));
  const auto by_token = expert_out.index_select(0, position).view({tokens.size(0), top_k_, d});
  if (kept.defined()) weights = weights * kept.view(weights.sizes());
  auto combine = weights.to(expert_out.scalar_type()).unsqueeze(-1);  // [N, k, 1]
  if (parts) combine = tp_.group->copy_to(combine);
  auto out = (by_token * combine).sum(1);
  if (parts) out = tp_.group->reduce_from(out);
  if (shared_expert) {
    // Whole on every rank: the shared expert's MLP makes its own tensor-parallel exchange,
    // and its gate, held whole, reads the whole tokens.
    auto shared = shared_expert->forward(LayerInput(tokens));
    if (shared_expert_gate) shared = shared * torch::sigmoid(shared_expert_gate->forward(tokens));
    out = out + shared;
  }
  out = out.view(x.sizes());
  if (!pass) return out;
  // Load balance: E sum_e f_e P_e, f_e the share of the choices expert e got (counted,
  // no gradient), P_e its mean probability (sigmoid scores: each token's divided by
  // their sum, as Megatron-Core does); 1 where both are uniform.
  const auto probs = sigmoid_ ? scores / scores.sum(-1, /*keepdim=*/true) : scores;
  at::Tensor balance;
  if (per_sequence_) {  // each sequence's balance, averaged over the micro-batch's
    const int64_t sequences = x.size(0), positions = tokens.size(0) / sequences;
    const auto counts = torch::zeros({sequences, n_experts_}, probs.options())
                            .scatter_add_(1, chosen.view({sequences, positions * top_k_}),
                                          torch::ones({sequences, positions * top_k_}, probs.options()));
    const auto share = counts / static_cast<double>(positions * top_k_);
    const auto mean_probs = probs.view({sequences, positions, n_experts_}).mean(1);
    balance = (share * mean_probs).sum(-1).mean() * static_cast<double>(n_experts_);
  } else {
    const auto share = per_expert.to(router) / static_cast<double>(choices.size(0));
    balance = (share * probs.mean(0)).sum() * static_cast<double>(n_experts_);
  }
  if (!recomputing_for_backward()) {  // the first forward records it, a recomputation does not again
    pass->balance = pass->balance.defined() ? pass->balance + balance.detach() : balance.detach();
    if (!pass->loads.defined())
      pass->loads = torch::zeros({n_layers_, n_experts_}, per_expert.options().dtype(torch::kFloat64));
    pass->loads[pass->layer].add_(per_expert);
  }
  if (!torch::GradMode::is_enabled()) return out;
  if (aux_coef_ != 0)
    out = AuxiliaryLossGradient::apply(out, balance, aux_coef_, c10::make_intrusive<PassHolder>(pass));
  if (z_coef_ != 0) {
    const auto z = torch::logsumexp(logits, -1).square().mean();
    if (!recomputing_for_backward()) pass->z = pass->z.defined() ? pass->z + z.detach() : z.detach();
    out = AuxiliaryLossGradient::apply(out, z, z_coef_, c10::make_intrusive<PassHolder>(pass));
  }
  return out;
}

torch::Tensor MoeImpl::choice_scores(const torch::Tensor& scores) const {
  auto s = expert_bias.defined() ? scores + expert_bias.to(scores.scalar_type()) : scores;
  if (groups_ == 1) return s;
  // Each group scored by the sum of its top k / group_top_k, the experts outside the
  // token's best group_top_k groups left out (-inf, as Megatron-Core masks them).
  const auto grouped = s.view({s.size(0), groups_, n_experts_ / groups_});
  const auto group_scores = std::get<0>(grouped.topk(top_k_ / group_top_k_, -1)).sum(-1);  // [N, G]
  const auto best = std::get<1>(group_scores.topk(group_top_k_, -1));                      // [N, group_top_k]
  const auto kept = torch::zeros_like(group_scores, torch::kBool).scatter_(1, best, true);
  return grouped.masked_fill(kept.logical_not().unsqueeze(-1), -std::numeric_limits<double>::infinity())
      .view({s.size(0), n_experts_});
}

void MoeImpl::balance_expert_bias(const torch::Tensor& load, double rate, const torch::Tensor& skip) {
  TORCH_CHECK(expert_bias.defined(), "balance_expert_bias: the block has no expert bias (model.moe_expert_bias)");
  torch::NoGradGuard no_grad;
  const auto l = load.to(expert_bias.device(), torch::kFloat64);
  // sign(0) = 0: an expert at the even load keeps its bias.
  auto step = (l.mean() - l).sign() * rate;
  if (skip.defined()) step = step * skip.to(step.device()).logical_not();
  expert_bias.add_(step.to(torch::kFloat32));
}

}  // namespace tide
