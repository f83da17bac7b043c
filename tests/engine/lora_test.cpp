// LoRA adapters (model.lora_rank) against PEFT's: the same base and adapter weights give
// transformers + peft's logits, loss and adapter gradients (tests/engine/hf_lora.py), and
// nothing but the adapters gets a gradient. Under bf16 compute a run holds the frozen
// matmul weights in bf16 and trains as on their fp32 values. lora_dropout drops the
// adapters' inputs alone, as PEFT's does, with the mask one process would draw in any
// tensor-parallel part.
#include <cmath>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "hf_reference.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/model_weights.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/model/weights_io.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/parallel/parallelize.h"
#include "tide/engine/run_layout.h"
#include "tiny_models.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

using testing::logit_tolerance;
using testing::read_named;

class LoraReference : public ::testing::TestWithParam<std::string> {};

// How far two fp32 evaluations of one gradient may lie apart when they differ in the
// order of their sums: logit_tolerance's argument over the chain from the loss back to
// the adapter, which passes the forward's sums and as many in backward (2 D), the longest
// adding K = max(dim, ffn, positions, rows) terms, relative to the gradient's largest
// element.
double gradient_tolerance(const ModelConfig& m, int64_t positions, int64_t rows, const torch::Tensor& g) {
  const double u = std::ldexp(1.0, -24);
  const double K = static_cast<double>(std::max({m.dim, resolved_ffn_dim(m), positions, rows}));
  const double D = 2 * (4.0 * static_cast<double>(m.n_layers) + 2.0);
  return D * K * u * std::sqrt(K) * g.abs().max().item<double>();
}

TEST_P(LoraReference, LogitsLossAndAdapterGradientsArePefts) {
  const fs::path root = fs::temp_directory_path() / ("tide_lora_reference_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const std::string cmd = std::string(TIDE_PYTHON) + " " + TIDE_SOURCE_DIR + "/tests/engine/hf_lora.py make " +
                          root.string() + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const fs::path dir = root / GetParam();

  const ModelWeights base = find_model_weights((dir / "base").string());
  ModelConfig m = base.config;
  m.lora_rank = 4;
  m.lora_alpha = 8;
  Transformer model(m);
  {
    // PEFT's keys are the model's names under "base_model.model.".
    const std::string prefix = "base_model.model.";
    const WeightFiles base_files(base.files, base.parameter_name, "the base");
    const WeightFiles adapter_files(
        {(dir / "adapter" / "adapter_model.safetensors").string()},
        [&](const std::string& n) { return n.rfind(prefix, 0) == 0 ? n.substr(prefix.size()) : ""; }, "the adapter");
    torch::NoGradGuard no_grad;
    int64_t adapter_numel = 0;
    for (auto& item : model->named_parameters()) {
      const bool lora = is_lora_parameter(item.key());
      item.value().copy_((lora ? adapter_files : base_files).read(item.key(), item.value().sizes().vec()));
      EXPECT_EQ(item.value().requires_grad(), lora) << item.key();
      if (lora) adapter_numel += item.value().numel();
    }
    EXPECT_EQ(adapter_files.size(), adapter_files.reads()) << "the adapter holds tensors the model has not";
    EXPECT_EQ(adapter_numel, lora_parameter_count(m));
  }

  SafetensorsReader ref((dir / "reference.safetensors").string());
  const auto ids = read_named(ref, "input_ids");
  const int64_t t = ids.size(1) - 1;
  const auto tokens = ids.narrow(1, 0, t), targets = ids.narrow(1, 1, t);
  const auto expected = read_named(ref, "logits");
  {
    torch::NoGradGuard no_grad;
    const auto logits = model->forward(tokens);
    ASSERT_EQ(logits.sizes(), expected.sizes());
    EXPECT_LE((logits - expected).abs().max().item<double>(), logit_tolerance(m, t, expected)) << GetParam();
  }
  const auto loss = model->loss(tokens, targets);
  // A token's cross-entropy moves by at most twice its logits' largest change.
  const double loss_tolerance = 2 * logit_tolerance(m, t, expected) + std::ldexp(1.0, -20);
  EXPECT_NEAR(loss.item<double>(), read_named(ref, "loss").item<double>(), loss_tolerance) << GetParam();
  loss.backward();
  int compared = 0;
  for (const auto& item : model->named_parameters()) {
    if (!is_lora_parameter(item.key())) {
      EXPECT_FALSE(item.value().grad().defined()) << item.key() << " is frozen and got a gradient";
      continue;
    }
    const auto theirs = read_named(ref, "grad|" + item.key());
    const auto& ours = item.value().grad();
    ASSERT_TRUE(ours.defined()) << item.key();
    ASSERT_EQ(ours.sizes(), theirs.sizes()) << item.key();
    ASSERT_GT(theirs.abs().max().item<double>(), 0) << item.key() << ": a zero gradient would compare nothing";
    EXPECT_LE((ours - theirs).abs().max().item<double>(), gradient_tolerance(m, t, ids.size(0) * t, theirs))
        << item.key();
    ++compared;
  }
  EXPECT_EQ(compared, 2 * m.n_layers * static_cast<int>(lora_target_names(m).size()));
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraReference, ::testing::Values("llama", "bloom"));

class LoraFrozenBase : public ::testing::TestWithParam<ModelConfig> {};

// Under bf16 compute a run holds each frozen weight that is only ever multiplied in bf16
// (parallelize.h), the rest (embeddings, norms, biases) in fp32: the loss and the
// adapters' gradients are those of the same base held in fp32, bit for bit, since every
// product multiplies by the same rounding of its fp32 values.
TEST_P(LoraFrozenBase, HeldInBf16ItTrainsTheAdaptersAsItsFp32ValuesDo) {
  RunConfig cfg;
  cfg.model = GetParam();
  cfg.model.lora_rank = 4;
  cfg.model.lora_alpha = 8;
  cfg.precision.compute = DType::BFloat16;
  cfg.seed = 5;
  ParallelModel held = parallelize(cfg, nullptr, BatchLayout{}, torch::kCPU);
  ParallelModel wide = parallelize(cfg, nullptr, BatchLayout{}, torch::kCPU);
  const auto multiplied = held.model->weights_read_in_compute_dtype();
  const auto held_params = held.model->named_parameters();
  int64_t in_bf16 = 0, in_fp32 = 0;
  for (auto& item : wide.model->named_parameters()) {
    if (item.value().requires_grad()) continue;
    const bool narrow = multiplied.count(item.key()) > 0;
    EXPECT_EQ(held_params[item.key()].scalar_type(), narrow ? torch::kBFloat16 : torch::kFloat32) << item.key();
    (narrow ? in_bf16 : in_fp32) += item.value().numel();
    auto values = torch::empty(item.value().sizes(), torch::kFloat32);
    wide.model->initialise_parameter(item.key(), values, 5);
    torch::NoGradGuard no_grad;
    item.value().set_data(values);
  }
  EXPECT_GT(in_bf16, 0);
  EXPECT_GT(in_fp32, 0) << "the embeddings and norms are read in fp32";
  torch::manual_seed(3);
  const auto ids = torch::randint(cfg.model.vocab_size, {2, 17});
  const auto tokens = ids.narrow(1, 0, 16), targets = ids.narrow(1, 1, 16);
  const auto step = [&](ParallelModel& pm) {
    pm.flat->zero_grad();
    auto loss = with_compute_dtype(DType::BFloat16, [&] { return pm.model->loss(tokens, targets); });
    loss.backward();
    return std::make_pair(loss.detach(), pm.flat->grad().clone());
  };
  const auto [held_loss, held_grads] = step(held);
  const auto [wide_loss, wide_grads] = step(wide);
  EXPECT_TRUE(torch::equal(held_loss, wide_loss)) << held_loss.item<double>() << " " << wide_loss.item<double>();
  ASSERT_GT(wide_grads.abs().max().item<double>(), 0) << "zero gradients would compare nothing";
  EXPECT_TRUE(torch::equal(held_grads, wide_grads));
}

INSTANTIATE_TEST_SUITE_P(Families, LoraFrozenBase, ::testing::Values(testing::tiny_llama(), testing::tiny_bloom()));

// An adapter's input under lora_dropout p: each element dropped or scaled by 1 / (1 - p)
// as at::dropout scales it, about p of them dropped, none in evaluation; a part of the
// input's columns (a row-parallel layer's on one rank) gets those columns of the mask the
// whole input gets from the same generator state.
TEST(LoraDropout, DropsTheAdaptersInputAsOneProcessWouldInAnyPart) {
  const double p = 0.25;
  Projection layer(512, 8, false, LoraShape{4, 8, p});
  layer->train();
  torch::manual_seed(7);
  const auto x = torch::randn({4, 64, 512});
  torch::manual_seed(11);
  const auto dropped = layer->adapter_input(x);
  const auto scale = torch::ones({}).div(1 - p);
  const auto kept = dropped != 0;
  EXPECT_TRUE(torch::equal(dropped, torch::where(kept, x * scale, torch::zeros_like(x))));
  // 131,072 Bernoulli draws: the dropped share's deviation is sqrt(p (1 - p) / n) = 0.0012.
  const double share = 1.0 - kept.to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(share, p, 6 * std::sqrt(p * (1 - p) / static_cast<double>(x.numel())));
  for (const int64_t parts : {2, 4}) {
    const int64_t w = 512 / parts;
    for (int64_t part = 0; part < parts; ++part) {
      torch::manual_seed(11);
      EXPECT_TRUE(torch::equal(layer->adapter_input(x.narrow(-1, part * w, w).contiguous(), part, parts),
                               dropped.narrow(-1, part * w, w)))
          << "part " << part << " of " << parts;
    }
  }
  layer->eval();
  EXPECT_TRUE(layer->adapter_input(x).is_same(x)) << "evaluation drops nothing";
  Projection plain(512, 8, false, LoraShape{4, 8, 0.0});
  plain->train();
  EXPECT_TRUE(plain->adapter_input(x).is_same(x));
}

// The frozen projections read their inputs whole: with B at its start (zero) a training
// forward under lora_dropout is the evaluation forward bit for bit, the adapters' inputs
// taken apart from the normed pass or not; with a trained B it is not, and the adapters
// alone get gradients.
TEST_P(LoraFrozenBase, UnderLoraDropoutTheFrozenProjectionsReadTheirInputsWhole) {
  ModelConfig m = GetParam();
  m.lora_rank = 4;
  m.lora_alpha = 8;
  m.lora_dropout = 0.5;
  Transformer model(m);
  model->reset_parameters(5);
  torch::manual_seed(3);
  const auto tokens = torch::randint(m.vocab_size, {2, 16});
  model->eval();
  const auto evaluated = model->forward(tokens);
  model->train();
  EXPECT_TRUE(torch::equal(model->forward(tokens), evaluated));
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters())
      if (ends_with(item.key(), ".lora_B.weight")) item.value().normal_(0, 0.02);
  }
  const auto trained_b = model->forward(tokens);
  model->eval();
  EXPECT_FALSE(torch::equal(trained_b, model->forward(tokens))) << "the adapters' inputs were not dropped";
  model->train();
  const auto targets = torch::randint(m.vocab_size, {2, 16});
  model->loss(tokens, targets).backward();
  for (const auto& item : model->named_parameters())
    EXPECT_EQ(item.value().grad().defined(), is_lora_parameter(item.key())) << item.key();
}

}  // namespace
}  // namespace tide
