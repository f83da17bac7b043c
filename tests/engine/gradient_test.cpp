// Autograd gradients of the whole decoder (every hand-written piece: RMSNorm, RoPE,
// ALiBi, GQA, SwiGLU, GELU, fused QKV, tied embeddings) against central finite
// differences in float64; activation checkpointing against plain backward.
#include <gtest/gtest.h>
#include <torch/types.h>

#include "recompute_pair.h"
#include "tide/engine/model/transformer.h"
#include "tiny_models.h"

namespace tide {
namespace {
using testing::tiny_bloom;
using testing::tiny_llama;

class Gradients : public ::testing::TestWithParam<ModelConfig> {};

TEST_P(Gradients, MatchFiniteDifferences) {
  ModelConfig c = GetParam();
  c.n_layers = 1;
  c.dim = c.family == Family::LLaMA ? 16 : 12;
  c.n_heads = c.family == Family::LLaMA ? 4 : 3;
  c.n_kv_heads = c.family == Family::LLaMA ? 2 : 0;
  c.vocab_size = 23;
  Transformer m(c);
  m->reset_parameters(5);
  m->to(torch::kFloat64);
  // Larger weights than the 0.02 init make every piece matter in the loss.
  {
    torch::NoGradGuard ng;
    for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.3);
  }
  torch::manual_seed(1);
  const auto tokens = torch::randint(0, c.vocab_size, {2, 6}, torch::kInt64);
  const auto targets = torch::randint(0, c.vocab_size, {2, 6}, torch::kInt64);
  m->zero_grad();
  m->loss(tokens, targets).backward();

  torch::NoGradGuard ng;
  const double eps = 1e-6;
  int checked = 0;
  for (auto& item : m->named_parameters()) {
    auto& p = item.value();
    const auto flat = p.view({-1});
    for (int64_t k = 0; k < std::min<int64_t>(3, flat.numel()); ++k) {
      const int64_t i = (k * 7919) % flat.numel();
      const double orig = flat[i].item<double>();
      flat[i] = orig + eps;
      const double up = m->loss(tokens, targets).item<double>();
      flat[i] = orig - eps;
      const double down = m->loss(tokens, targets).item<double>();
      flat[i] = orig;
      const double numeric = (up - down) / (2 * eps);
      const double analytic = p.grad().view({-1})[i].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::abs(numeric)) << item.key() << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST_P(Gradients, ActivationCheckpointingGivesEqualGradients) {
  ModelConfig config = GetParam();
  config.dropout = 0.1;  // recomputation must replay the same dropout masks
  config.n_layers = 3;
  // Every block recomputed, and only the first (model.recompute_blocks), the others
  // keeping their saved tensors: the same forward either way.
  for (const int64_t recompute_blocks : {0, 1}) {
    const auto run = testing::with_and_without_recompute(config, torch::kCPU, recompute_blocks);
    EXPECT_EQ(run.plain_loss, run.checkpointed_loss) << recompute_blocks;
    auto pb = run.checkpointed->named_parameters();
    for (const auto& item : run.plain->named_parameters()) {
      ASSERT_TRUE(pb[item.key()].grad().defined()) << item.key();
      EXPECT_TRUE(torch::allclose(item.value().grad(), pb[item.key()].grad(), 1e-6, 1e-7))
          << item.key() << " recomputing " << recompute_blocks;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Model, Gradients, ::testing::Values(tiny_llama(), tiny_bloom()),
                         [](const auto& info) { return info.param.family == Family::LLaMA ? "llama" : "bloom"; });

}  // namespace
}  // namespace tide
