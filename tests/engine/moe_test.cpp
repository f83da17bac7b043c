// Mixture of experts (model.moe_experts): the routed output against a per-token sum, the
// load-balancing loss's gradient against finite differences of the balance the model
// reports, recomputed blocks against kept ones, and what a block keeps for backward
// against what the planner counts.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "recompute_pair.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/plan/plan.h"
#include "tide/engine/run_layout.h"
#include "tide/engine/train/tensor_memory.h"
#include "tiny_models.h"

namespace tide {
namespace {

// One expert as Mixtral writes it: down(silu(gate x) * up x), x [D].
torch::Tensor expert_of(MlpImpl& e, const torch::Tensor& x) {
  return torch::mv(e.down->weight, torch::silu(torch::mv(e.gate->weight, x)) * torch::mv(e.up->weight, x));
}

// How a router scores and weighs (model.moe_router, moe_normalize_top_k,
// moe_routed_scale) and whether a bias steers its choices (model.moe_expert_bias).
struct Routing {
  bool normalize, sigmoid;
  double scale;
  bool bias;
  int64_t groups = 1, group_top_k = 1;  // model.moe_groups, model.moe_group_top_k
  double capacity_factor = 0;           // model.moe_capacity_factor (in training)
  bool drop_by_position = false;        // model.moe_drop_policy
};

void expect_routed_sum(const Routing& r) {
  ModelConfig cfg = testing::tiny_moe();
  cfg.moe_normalize_top_k = r.normalize;
  cfg.moe_router = r.sigmoid ? MoeRouterScore::Sigmoid : MoeRouterScore::Softmax;
  cfg.moe_routed_scale = r.scale;
  cfg.moe_expert_bias = r.bias;
  cfg.moe_groups = r.groups;
  cfg.moe_group_top_k = r.group_top_k;
  cfg.moe_capacity_factor = r.capacity_factor;
  cfg.moe_drop_policy = r.drop_by_position ? MoeDropPolicy::Position : MoeDropPolicy::Probs;
  Transformer model(cfg);
  model->reset_parameters(3);
  model->to(torch::kFloat64);
  auto& moe = *model->blocks->ptr<BlockImpl>(1)->moe;
  const auto bias =
      r.bias ? torch::tensor({0.3, -0.3, 0.0, 0.05}, torch::kFloat64) : torch::zeros({4}, torch::kFloat64);
  if (r.bias) moe.expert_bias.copy_(bias);
  torch::manual_seed(5);
  const auto x = torch::randn({2, 7, cfg.dim}, torch::kFloat64);
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = moe.forward(x, nullptr);
  }
  ASSERT_EQ(out.sizes(), x.sizes());
  const auto tokens = x.reshape({-1, cfg.dim});
  int steered = 0;  // tokens whose choice the bias changed
  // Every (token, choice) pair: its weight, and its expert's output for the token.
  struct Pair {
    int64_t token, index, expert;
    double weight;
  };
  std::vector<Pair> pairs;
  for (int64_t n = 0; n < tokens.size(0); ++n) {
    const auto logits = torch::mv(moe.gate->weight, tokens[n]);
    const auto p = r.sigmoid ? logits.sigmoid() : logits.softmax(0);
    auto choice = p + bias;
    if (r.groups > 1) {  // the experts outside the token's best groups left out
      const int64_t size = cfg.moe_experts / r.groups;
      std::vector<std::pair<double, int64_t>> group_scores;
      for (int64_t g = 0; g < r.groups; ++g) {
        const auto top = std::get<0>(choice.narrow(0, g * size, size).sort(0, /*descending=*/true));
        group_scores.emplace_back(top.narrow(0, 0, cfg.moe_top_k / r.group_top_k).sum().item<double>(), g);
      }
      std::sort(group_scores.rbegin(), group_scores.rend());
      for (int64_t j = r.group_top_k; j < r.groups; ++j)
        choice.narrow(0, group_scores[static_cast<size_t>(j)].second * size, size).fill_(-1e300);
    }
    const auto sorted = std::get<1>(choice.sort(0, /*descending=*/true));
    const auto unbiased = std::get<1>(p.sort(0, /*descending=*/true));
    double chosen = 0;
    for (int64_t j = 0; j < cfg.moe_top_k; ++j) chosen += p[sorted[j].item<int64_t>()].item<double>();
    bool differs = false;
    for (int64_t j = 0; j < cfg.moe_top_k; ++j) {
      const int64_t e = sorted[j].item<int64_t>();
      differs = differs || !unbiased.narrow(0, 0, cfg.moe_top_k).eq(e).any().item<bool>();
      pairs.push_back({n, n * cfg.moe_top_k + j, e, p[e].item<double>() / (r.normalize ? chosen : 1.0) * r.scale});
    }
    steered += differs ? 1 : 0;
  }
  // Under a capacity each expert keeps its first pairs: by token, or by weight (highest
  // first, ties by token).
  const auto n_pairs = static_cast<int64_t>(pairs.size());
  const auto capacity =
      r.capacity_factor > 0 ? static_cast<int64_t>(std::ceil(r.capacity_factor * n_pairs / 4.0)) : n_pairs;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Pair& a, const Pair& b) {
    if (a.expert != b.expert) return a.expert < b.expert;
    return r.drop_by_position ? a.index < b.index : a.weight > b.weight;
  });
  std::vector<torch::Tensor> want(static_cast<size_t>(tokens.size(0)), torch::zeros({cfg.dim}, torch::kFloat64));
  int64_t dropped = 0, taken = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    taken = i > 0 && pairs[i].expert == pairs[i - 1].expert ? taken + 1 : 0;
    if (taken >= capacity) {
      ++dropped;
      continue;
    }
    const Pair& q = pairs[i];
    want[static_cast<size_t>(q.token)] =
        want[static_cast<size_t>(q.token)] +
        q.weight * expert_of(*moe.experts[static_cast<size_t>(q.expert)], tokens[q.token]);
  }
  for (int64_t n = 0; n < tokens.size(0); ++n)
    // fp64 sums of 24 and 32 products of values below 1 (times the scale): rounding far
    // under 1e-12.
    EXPECT_TRUE(torch::allclose(out.reshape({-1, cfg.dim})[n], want[static_cast<size_t>(n)], 0, 1e-12 * r.scale))
        << "token " << n;
  if (r.capacity_factor > 0) {
    EXPECT_GT(dropped, 0) << "the capacity dropped nothing: the test shows nothing";
  }
  if (r.bias || r.group_top_k < r.groups) {
    EXPECT_GT(steered, 0) << "the bias or the groups changed no token's choice: the test shows nothing";
  }
}

TEST(MixtureOfExperts, OutputIsTheChosenExpertsWeightedByTheRouter) {
  expect_routed_sum({true, false, 1.0, false});
  expect_routed_sum({false, false, 1.0, false});
}

TEST(MixtureOfExperts, SigmoidScoresScaledAsDeepSeekV3Weighs) {
  expect_routed_sum({true, true, 1.0, false});
  expect_routed_sum({false, true, 2.5, false});
}

TEST(MixtureOfExperts, TheExpertBiasChoosesAndDoesNotWeigh) {
  expect_routed_sum({true, false, 1.0, true});
  expect_routed_sum({true, true, 2.5, true});
}

TEST(MixtureOfExperts, GroupLimitedRoutingChoosesWithinTheBestGroups) {
  // Two groups of two experts, top 2 from the best group: both of one group's experts.
  expect_routed_sum({true, false, 1.0, false, 2, 1});
  // DeepSeek-V3's form: sigmoid scores plus biases choose the groups and the experts.
  expect_routed_sum({true, true, 2.5, true, 2, 1});
  // Two groups of two, each token's best two: no limit, as without groups.
  expect_routed_sum({true, false, 1.0, false, 2, 2});
}

TEST(MixtureOfExperts, ACapacityDropsEachExpertsPairsPastItInTrainingAlone) {
  // 14 tokens, 28 pairs, 4 experts: a factor 0.5 keeps 4 pairs an expert.
  expect_routed_sum({true, false, 1.0, false, 1, 1, 0.5, false});
  expect_routed_sum({true, false, 1.0, false, 1, 1, 0.5, true});
  expect_routed_sum({false, true, 2.5, true, 2, 1, 0.75, false});
  // Evaluation drops nothing.
  ModelConfig cfg = testing::tiny_moe();
  cfg.moe_capacity_factor = 0.5;
  Transformer capped(cfg), dropless(testing::tiny_moe());
  capped->reset_parameters(3);
  dropless->reset_parameters(3);
  capped->eval();
  dropless->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 7, cfg.dim});
  EXPECT_TRUE(torch::equal(capped->blocks->ptr<BlockImpl>(1)->moe->forward(x, nullptr),
                           dropless->blocks->ptr<BlockImpl>(1)->moe->forward(x, nullptr)));
}

TEST(MixtureOfExperts, GroupsThatCannotHoldTheChoicesAreRefusedNamingTheField) {
  const auto refusal = [](int64_t groups, int64_t group_top_k) {
    RunConfig cfg;
    cfg.model = testing::tiny_moe();  // 4 experts, top 2
    cfg.data.seq_len = cfg.model.max_seq_len;
    cfg.model.moe_groups = groups;
    cfg.model.moe_group_top_k = group_top_k;
    try {
      validate(cfg);
    } catch (const ConfigError& e) {
      return e.field() + ": " + e.what();
    }
    return std::string();
  };
  EXPECT_EQ(refusal(2, 1), "");
  EXPECT_NE(refusal(3, 1).find("model.moe_groups: 3 groups do not divide model.moe_experts = 4"), std::string::npos)
      << refusal(3, 1);
  EXPECT_NE(refusal(2, 3).find("model.moe_group_top_k: 3 groups a token is more than"), std::string::npos)
      << refusal(2, 3);
  // One expert a group, one group a token: fewer experts than the top 2.
  EXPECT_NE(refusal(4, 1).find("model.moe_group_top_k: 1 groups of 1 experts hold fewer than model.moe_top_k = 2"),
            std::string::npos)
      << refusal(4, 1);
}

TEST(MixtureOfExperts, TheExpertBiasMovesTowardTheEvenLoadUnlessTheStepIsSkipped) {
  ModelConfig cfg = testing::tiny_moe();
  cfg.moe_expert_bias = true;
  Transformer model(cfg);
  auto& first = *model->blocks->ptr<BlockImpl>(0)->moe;
  auto& second = *model->blocks->ptr<BlockImpl>(1)->moe;
  ASSERT_TRUE(first.expert_bias.defined());
  EXPECT_EQ(first.expert_bias.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(first.expert_bias.eq(0).all().item<bool>());
  // Each block its own layer's row: the mean load is 5 in layer 0, 4 in layer 1.
  const auto loads = torch::tensor({10.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0}, torch::kFloat64).view({2, 4});
  const auto taken = torch::zeros({}, torch::kBool), skipped = torch::ones({}, torch::kBool);
  model->balance_expert_biases(loads, 0.01, taken);
  EXPECT_TRUE(torch::equal(first.expert_bias, torch::tensor({-0.01F, 0.01F, 0.01F, 0.01F})));
  EXPECT_TRUE(second.expert_bias.eq(0).all().item<bool>()) << "an even load moves no bias";
  model->balance_expert_biases(loads, 0.01, skipped);
  EXPECT_TRUE(torch::equal(first.expert_bias, torch::tensor({-0.01F, 0.01F, 0.01F, 0.01F})));
  model->balance_expert_biases(loads, 0.01, taken);
  EXPECT_TRUE(torch::equal(first.expert_bias, torch::tensor({-0.02F, 0.02F, 0.02F, 0.02F})));
  // Not a parameter: the optimizer's buffers leave it out, weight files carry it.
  EXPECT_FALSE(model->named_parameters().contains("model.layers.0.mlp.expert_bias"));
  EXPECT_TRUE(model->named_buffers().contains("model.layers.0.mlp.expert_bias"));
  EXPECT_TRUE(is_expert_bias("model.layers.0.mlp.expert_bias"));
  EXPECT_FALSE(is_expert_parameter("model.layers.0.mlp.expert_bias"));
}

TEST(MixtureOfExperts, AnExpertNoTokenChoseGetsAZeroGradient) {
  // Data-parallel ranks reduce a bucket once every parameter in it has its gradient: an
  // expert unused on one rank must have one there too.
  Transformer model(testing::tiny_moe());
  model->reset_parameters(4);
  auto& moe = *model->blocks->ptr<BlockImpl>(0)->moe;
  const auto x = torch::randn({1, 1, 32});  // one token: 2 of the 4 experts chosen
  moe.forward(x, nullptr).sum().backward();
  int unused = 0;
  for (size_t e = 0; e < moe.experts.size(); ++e) {
    const auto g = moe.experts[e]->up->weight.grad();
    ASSERT_TRUE(g.defined()) << "expert " << e;
    unused += g.abs().sum().item<double>() == 0 ? 1 : 0;
  }
  EXPECT_EQ(unused, 2);
}

TEST(MixtureOfExperts, ParametersAreNamedAsQwenMoeAndCounted) {
  const ModelConfig cfg = testing::tiny_moe();
  Transformer model(cfg);
  const auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("model.layers.0.mlp.gate.weight"));
  EXPECT_EQ(params["model.layers.0.mlp.gate.weight"].sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(params["model.layers.1.mlp.experts.3.down_proj.weight"].sizes(), (std::vector<int64_t>{32, 24}));
  EXPECT_FALSE(params.contains("model.layers.0.mlp.up_proj.weight"));
  int64_t total = 0;
  for (const auto& p : params) total += p.value().numel();
  EXPECT_EQ(total, parameter_count(cfg));
  // Each token passes through 2 of the 4 experts of 3 * 32 * 24 weights, in each of 2 blocks.
  EXPECT_EQ(inactive_expert_parameter_count(cfg), 2 * 2 * 3 * 32 * 24);
  // The router reads its fp32 weight; the experts' projections their working copies.
  const auto compute = model->weights_read_in_compute_dtype();
  EXPECT_EQ(compute.count("model.layers.0.mlp.gate.weight"), 0u);
  EXPECT_EQ(compute.count("model.layers.0.mlp.experts.2.up_proj.weight"), 1u);
}

TEST(MixtureOfExperts, ExpertNamesSayTheirIndexAndNothingElseIsAnExpert) {
  EXPECT_EQ(expert_index("model.layers.3.mlp.experts.12.up_proj.weight"), 12);
  EXPECT_TRUE(is_expert_parameter("model.layers.0.mlp.experts.0.down_proj.weight"));
  EXPECT_FALSE(is_expert_parameter("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(is_expert_parameter("model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(is_expert_parameter("model.layers.0.mlp.experts.x.up_proj.weight"));
}

TEST(MixtureOfExperts, ExpertParallelismIsRefusedWhereItCannotSpreadTheExpertsNamingTheField) {
  RunConfig cfg;
  cfg.model = testing::tiny_moe();  // 4 experts
  cfg.data.seq_len = 16;
  cfg.batch.global_batch = 4;
  cfg.batch.micro_batch = 1;
  const auto refused = [](const RunConfig& c, int world, const std::string& words) {
    try {
      check_supported_layout(c, world);
      ADD_FAILURE() << "accepted; expected a refusal of parallel.ep";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "parallel.ep") << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  cfg.parallel.ep = 2;
  EXPECT_NO_THROW(check_supported_layout(cfg, 2));
  EXPECT_NO_THROW(check_supported_layout(cfg, 4));  // two ranks hold each expert
  refused(cfg, 1, "does not divide the data-parallel degree dp = 1");
  RunConfig three = cfg;
  three.parallel.ep = 3;
  refused(three, 3, "3 does not divide model.moe_experts = 4");
  RunConfig dense = cfg;
  dense.model.moe_experts = 0;
  refused(dense, 2, "the model has none");
  try {  // caught before the world size is known
    validate(dense);
    ADD_FAILURE() << "a dense model under parallel.ep = 2 validated";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "parallel.ep") << e.what();
  }
}

// One of a block's auxiliary losses: its coefficient in the config and the blocks'
// statistic summed, as one training forward reports it.
struct Auxiliary {
  double ModelConfig::*coef;
  torch::Tensor (TransformerImpl::*take)();
};

double summed_statistic(Transformer& model, const Auxiliary& aux, const torch::Tensor& tokens,
                        const torch::Tensor& targets) {
  model->loss(tokens, targets);
  return ((*model).*aux.take)().item<double>();
}

// The gradients a model with the loss at `coef` gets beyond those of the same model
// without it are coef times the gradient of the blocks' summed statistic, weighted as
// the language model's loss is.
void expect_coefficient_times_loss_gradient(const Auxiliary& aux, double coef,
                                            MoeBalanceScope scope = MoeBalanceScope::MicroBatch) {
  ModelConfig cfg = testing::tiny_moe();
  cfg.moe_aux_loss = 0;
  cfg.moe_balance_scope = scope;
  cfg.*aux.coef = coef;
  ModelConfig without = cfg;
  without.*aux.coef = 0;
  Transformer model(cfg), plain(without);
  for (Transformer* m : {&model, &plain}) {
    (*m)->reset_parameters(11);
    (*m)->to(torch::kFloat64);
    (*m)->train();
  }
  torch::manual_seed(2);
  const auto tokens = torch::randint(0, cfg.vocab_size, {2, 12}, torch::kInt64);
  const auto targets = torch::randint(0, cfg.vocab_size, {2, 12}, torch::kInt64);
  // Backward from 3 times the loss, as from a micro-batch's share times a loss scale: the
  // auxiliary loss's gradient is weighted alike.
  const double scale = 3.0;
  const auto loss = model->loss(tokens, targets);
  const auto plain_loss = plain->loss(tokens, targets);
  EXPECT_EQ(loss.item<double>(), plain_loss.item<double>());  // the reported loss is the language model's
  (loss * scale).backward();
  (plain_loss * scale).backward();
  const auto statistic = ((*model).*aux.take)();
  ASSERT_TRUE(statistic.defined());
  EXPECT_GT(statistic.item<double>(), 0.0);
  // Layer 0's router, and a weight of layer 0's attention, which moves layer 1's router
  // input: the auxiliary loss's gradient reaches both.
  const auto params = model->named_parameters();
  for (const std::string name :
       {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight", "model.layers.0.self_attn.q_proj.weight"}) {
    const auto& weight = params[name];
    const auto added = (weight.grad() - plain->named_parameters()[name].grad()).reshape({-1});
    for (int64_t i : {0, 5, 17}) {
      const double eps = 1e-6;
      auto flat = weight.detach().view({-1});
      const double kept = flat[i].item<double>();
      flat[i].fill_(kept + eps);
      const double up = summed_statistic(model, aux, tokens, targets);
      flat[i].fill_(kept - eps);
      const double down = summed_statistic(model, aux, tokens, targets);
      flat[i].fill_(kept);
      const double want = coef * scale * (up - down) / (2 * eps);
      // A central difference of a smooth fp64 function (no token changes expert by a
      // step of 1e-6): truncation ~eps^2, rounding ~1e-16 / eps; the gradients are ~1e-3.
      EXPECT_NEAR(added[i].item<double>(), want, 1e-8 + 1e-5 * std::abs(want)) << name << "[" << i << "]";
      EXPECT_NE(want, 0.0) << name << "[" << i << "]";
    }
  }
}

TEST(MixtureOfExperts, BalanceLossGradientIsItsCoefficientTimesTheLossGradient) {
  expect_coefficient_times_loss_gradient({&ModelConfig::moe_aux_loss, &TransformerImpl::take_moe_balance}, 0.25);
}

TEST(MixtureOfExperts, SequenceWiseBalanceLossGradientIsItsCoefficientTimesTheLossGradient) {
  expect_coefficient_times_loss_gradient({&ModelConfig::moe_aux_loss, &TransformerImpl::take_moe_balance}, 0.25,
                                         MoeBalanceScope::Sequence);
}

TEST(MixtureOfExperts, ASequenceWiseBalanceIsTheMeanOfEachSequencesOwn) {
  ModelConfig cfg = testing::tiny_moe();
  cfg.moe_balance_scope = MoeBalanceScope::Sequence;
  ModelConfig batch_wide = cfg;
  batch_wide.moe_balance_scope = MoeBalanceScope::MicroBatch;
  Transformer model(cfg), plain(batch_wide);
  for (Transformer* m : {&model, &plain}) {
    (*m)->reset_parameters(11);
    (*m)->to(torch::kFloat64);
    (*m)->train();
  }
  torch::manual_seed(4);
  const auto tokens = torch::randint(0, cfg.vocab_size, {2, 12}, torch::kInt64);
  const auto targets = torch::randint(0, cfg.vocab_size, {2, 12}, torch::kInt64);
  const Auxiliary balance{&ModelConfig::moe_aux_loss, &TransformerImpl::take_moe_balance};
  const double both = summed_statistic(model, balance, tokens, targets);
  const double first = summed_statistic(model, balance, tokens.narrow(0, 0, 1), targets.narrow(0, 0, 1));
  const double second = summed_statistic(model, balance, tokens.narrow(0, 1, 1), targets.narrow(0, 1, 1));
  // fp64 sums of 24 terms near 1: rounding ~1e-15.
  EXPECT_NEAR(both, (first + second) / 2, 1e-12);
  // One sequence is the whole micro-batch; two routed apart are not.
  EXPECT_NEAR(summed_statistic(plain, balance, tokens.narrow(0, 0, 1), targets.narrow(0, 0, 1)), first, 1e-12);
  EXPECT_GT(std::abs(summed_statistic(plain, balance, tokens, targets) - both), 1e-6);
}

TEST(MixtureOfExperts, RouterZLossGradientIsItsCoefficientTimesTheLossGradient) {
  expect_coefficient_times_loss_gradient({&ModelConfig::moe_z_loss, &TransformerImpl::take_moe_z}, 0.25);
}

TEST(MixtureOfExperts, RecomputedBlocksGiveTheGradientsOfKeptOnes) {
  auto pair = testing::with_and_without_recompute(testing::tiny_moe(), torch::kCPU);
  EXPECT_EQ(pair.plain_loss, pair.checkpointed_loss);
  // Each layer's experts got each token's k choices once (moe_max_load's counts): a block
  // recomputed in backward counts nothing again; both models route alike.
  const auto plain = pair.plain->take_moe_loads(), checkpointed = pair.checkpointed->take_moe_loads();
  ASSERT_TRUE(plain.defined() && checkpointed.defined());
  const auto cfg = testing::tiny_moe();
  ASSERT_EQ(plain.sizes(), (std::vector<int64_t>{cfg.n_layers, cfg.moe_experts}));
  for (int64_t layer = 0; layer < cfg.n_layers; ++layer)
    EXPECT_EQ(plain[layer].sum().item<double>(), static_cast<double>(int64_t{2} * 16 * cfg.moe_top_k))
        << "layer " << layer;
  EXPECT_TRUE(torch::equal(plain, checkpointed));
  EXPECT_FALSE(pair.plain->take_moe_loads().defined()) << "taken: none left";
  const auto kept = pair.plain->named_parameters();
  int64_t compared = 0;
  for (const auto& p : pair.checkpointed->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    // The same operations on the same values, in the same order: equal.
    EXPECT_TRUE(torch::equal(p.value().grad(), kept[p.key()].grad())) << p.key();
    ++compared;
  }
  EXPECT_GT(compared, 40);
}

// What a block keeps for backward (the graph's saved tensors, counted by the allocator:
// what a forward of four blocks leaves alive beyond one of two, halved) is what the
// planner's memory model counts for it (plan.h: activations_by_block), byte for byte
// but the load balance's statistics (three vectors of E): the routed rows, the experts'
// activations and their output kept once each (an index_add combining the weighted rows
// would keep them twice). Without expert parallelism a block keeps as much however the
// tokens are routed; top 2, every expert a token, and top 2 beside a gated shared expert.
TEST(MixtureOfExperts, ABlockKeepsWhatThePlannerCounts) {
  count_host_tensor_memory();
  const int64_t b = 2, t = 64;
  // Top 2; top E; top 2 with a gated shared expert; DeepSeek-V3's routing (sigmoid scores,
  // biases, groups, scaled) with a router z-loss.
  for (const std::string variant : {"top 2", "top 4", "shared expert", "deepseek-v3 routing, z-loss"}) {
    ModelConfig c = testing::tiny_moe();
    if (variant == "top 4") c.moe_top_k = 4;
    if (variant == "shared expert") {
      c.moe_shared_ffn_dim = 40;
      c.moe_shared_gate = true;
    }
    if (variant == "deepseek-v3 routing, z-loss") {
      c.moe_router = MoeRouterScore::Sigmoid;
      c.moe_expert_bias = true;
      c.moe_groups = 2;
      c.moe_routed_scale = 2.5;
      c.moe_z_loss = 1e-3;
    }
    c.max_seq_len = t;
    const auto kept = [&](int64_t layers) {
      ModelConfig deep = c;
      deep.n_layers = layers;
      torch::manual_seed(0);
      Transformer m(deep);
      const auto tokens = torch::randint(0, c.vocab_size, {b, t}, torch::kInt64);
      const auto targets = torch::randint(0, c.vocab_size, {b, t}, torch::kInt64);
      const int64_t before = host_tensor_bytes();
      const auto loss = m->loss(tokens, targets);
      return host_tensor_bytes() - before;
    };
    const double block = static_cast<double>(kept(4) - kept(2)) / 2;
    RunConfig cfg;
    cfg.model = c;
    cfg.model.n_layers = 4;
    cfg.data.seq_len = t;
    Cluster host;
    host.device.host = true;
    host.device.memory_bytes = 1e12;
    PlanLayout one;
    one.micro_batch = b;
    const auto planned = evaluate_layout(cfg, host, one).memory.activations_by_block;
    ASSERT_EQ(planned.size(), 4u);
    // Not activations: the balance's two E-vectors of floats, the layer's row of the
    // step's loads (moe_max_load), E doubles, and the z statistic's float.
    const double balance = 2.0 * static_cast<double>(c.moe_experts) * 4 + static_cast<double>(c.moe_experts) * 8 + 4;
    EXPECT_NEAR(block, planned[0], balance) << variant << ": a block keeps " << block << " bytes";
  }
}

}  // namespace
}  // namespace tide
