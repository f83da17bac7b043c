// The training loop end to end, in this process, on a real prepared dataset.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_data.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/trainer.h"
#include "tiny_models.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

RunConfig tiny_run(const std::string& name) {
  RunConfig c;
  c.name = name;
  c.model = testing::tiny_llama();
  c.model.vocab_size = 257;  // bytes + end-of-text
  c.data.path = testing::small_dataset();
  c.data.seq_len = 32;
  c.batch.micro_batch = 4;
  c.batch.global_batch = 8;  // two micro-batches: gradient accumulation
  c.optimizer.lr = 3e-3;
  c.schedule.steps = 6;
  c.schedule.warmup_steps = 2;
  c.eval.every = 3;
  c.eval.batches = 2;
  c.threads = 1;
  return c;
}

std::vector<double> losses_of(const fs::path& run) {
  std::vector<double> out;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

TEST(Training, OverfitsOneBatchToNearZero) {
  for (const ModelConfig& base : {testing::tiny_llama(), testing::tiny_bloom()}) {
    ModelConfig c = base;
    c.vocab_size = 50;
    torch::manual_seed(0);
    Transformer m(c);
    m->reset_parameters(1);
    OptimConfig o;
    o.weight_decay = 0;
    FlatParameters flat(*m, o);
    AdamW adam(flat, o);
    const auto tokens = torch::randint(0, c.vocab_size, {2, 16}, torch::kInt64);
    const auto targets = torch::randint(0, c.vocab_size, {2, 16}, torch::kInt64);
    double loss = 0;
    for (int i = 0; i < 300; ++i) {
      flat.zero_grad();
      auto l = m->loss(tokens, targets);
      l.backward();
      adam.step(3e-3);
      loss = l.item<double>();
    }
    EXPECT_LT(loss, 0.05) << (c.family == Family::LLaMA ? "llama" : "bloom");
  }
}

TEST(Training, RunWritesItsDirectoryAndIsRepeatable) {
  const fs::path a = fs::temp_directory_path() / ("tide_run_a_" + std::to_string(::getpid()));
  const fs::path b = fs::temp_directory_path() / ("tide_run_b_" + std::to_string(::getpid()));
  fs::remove_all(a);
  fs::remove_all(b);
  TrainHooks hooks;
  hooks.show_progress = false;
  hooks.peak_flops = 1e11;
  const TrainResult r = Trainer(tiny_run("a"), a.string(), hooks).run();
  Trainer(tiny_run("b"), b.string(), hooks).run();
  EXPECT_EQ(r.steps, 6);
  for (const char* f : {"config.json", "metrics.jsonl", "train.log", "model.safetensors", "tokenizer.json", "summary.json"})
    EXPECT_TRUE(fs::exists(a / f)) << f;
  const auto la = losses_of(a), lb = losses_of(b);
  ASSERT_EQ(la.size(), 6u);
  EXPECT_EQ(la, lb);  // same seed, same data: the same run
  EXPECT_LT(la.back(), la.front());
  ASSERT_TRUE(r.final_val_loss.has_value());
  // The saved weights load back and give the validation loss the run reported.
  LoadedModel m = load_model(a.string());
  EXPECT_FALSE(m.tokenizer_path.empty());
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Training, LuaStyleScheduleHookDrivesTheLearningRate) {
  const fs::path dir = fs::temp_directory_path() / ("tide_run_lr_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainHooks hooks;
  hooks.show_progress = false;
  hooks.peak_flops = 1e11;
  hooks.lr = [](int64_t step) { return 1e-3 * static_cast<double>(step + 1); };
  std::vector<double> seen;
  hooks.on_step = [&](const StepMetrics& m) { seen.push_back(m.lr); };
  RunConfig c = tiny_run("lr");
  c.schedule.steps = 3;
  Trainer(c, dir.string(), hooks).run();
  EXPECT_EQ(seen, (std::vector<double>{1e-3, 2e-3, 3e-3}));
  fs::remove_all(dir);
}

TEST(Training, GradientAccumulationEqualsOneLargeBatch) {
  // Two micro-batches of 4 and one micro-batch of 8 see the same 8 windows.
  TrainHooks hooks;
  hooks.show_progress = false;
  hooks.peak_flops = 1e11;
  RunConfig accumulated = tiny_run("accumulated"), whole = tiny_run("whole");
  accumulated.schedule.steps = whole.schedule.steps = 2;
  accumulated.schedule.warmup_steps = whole.schedule.warmup_steps = 0;
  whole.batch.micro_batch = 8;
  const fs::path a = fs::temp_directory_path() / ("tide_run_acc_" + std::to_string(::getpid()));
  const fs::path b = fs::temp_directory_path() / ("tide_run_whole_" + std::to_string(::getpid()));
  Trainer(accumulated, a.string(), hooks).run();
  Trainer(whole, b.string(), hooks).run();
  const auto la = losses_of(a), lb = losses_of(b);
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(la[i], lb[i], 1e-5 * std::abs(lb[i])) << i;
  LoadedModel ma = load_model(a.string()), mb = load_model(b.string());
  auto pb = mb.model->named_parameters();
  for (const auto& item : ma.model->named_parameters())
    EXPECT_TRUE(torch::allclose(item.value(), pb[item.key()], 1e-5, 1e-6)) << item.key();
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Training, Bf16AutocastTrains) {
  RunConfig c = tiny_run("bf16");
  c.precision.compute = DType::BFloat16;
  c.schedule.steps = 8;
  TrainHooks hooks;
  hooks.show_progress = false;
  hooks.peak_flops = 1e11;
  const fs::path dir = fs::temp_directory_path() / ("tide_run_bf16_" + std::to_string(::getpid()));
  Trainer(c, dir.string(), hooks).run();
  const auto l = losses_of(dir);
  ASSERT_EQ(l.size(), 8u);
  for (double x : l) EXPECT_TRUE(std::isfinite(x));
  EXPECT_LT(l.back(), l.front());
  fs::remove_all(dir);
}

TEST(Training, VocabularySmallerThanTheDataIsRefused) {
  RunConfig c = tiny_run("small_vocab");
  c.model.vocab_size = 100;
  EXPECT_THROW(Trainer(c, (fs::temp_directory_path() / "tide_never").string()), std::exception);
}

}  // namespace
}  // namespace tide
