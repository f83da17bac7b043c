// The training loop end to end, in this process, on a real prepared dataset.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

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
  RunConfig c = testing::tiny_byte_run(name);  // two micro-batches: gradient accumulation
  c.optimizer.lr = 3e-3;
  c.schedule.steps = 6;
  c.schedule.warmup_steps = 2;
  c.eval.every = 3;
  c.eval.batches = 2;
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
  // The recipe left precision.compute at auto: the record says what the CPU ran.
  std::ifstream config(a / "config.json");
  EXPECT_EQ(nlohmann::json::parse(config)["precision"]["compute"], "fp32");
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

TEST(Training, TheHostReadsAStepAfterQueueingTheNextUnlessAPolicyMustJudgeIt) {
  // The order in which the trainer starts a step (the loss tap of its first micro-batch)
  // and reports one (on_step) shows when the host reads a step's values: one step late by
  // default; before the update with an on_anomaly policy. The numbers are the same.
  const fs::path dir = fs::temp_directory_path() / ("tide_run_lag_" + std::to_string(::getpid()));
  RunConfig c = tiny_run("lag");
  c.eval.every = 0;
  c.checkpoint.every = 0;  // the last step's checkpoint only
  auto run = [&](bool policy) {
    fs::remove_all(dir);
    std::vector<std::string> order;
    TrainHooks hooks;
    hooks.show_progress = false;
    hooks.peak_flops = 1e11;
    hooks.loss_tap = [&](int64_t step, int64_t micro, const at::Tensor& loss) {
      if (micro == 0) order.push_back("start " + std::to_string(step + 1));
      return loss;
    };
    hooks.on_step = [&](const StepMetrics& m) { order.push_back("report " + std::to_string(m.step)); };
    if (policy) hooks.anomaly_policy = [](const nlohmann::json&) { return nlohmann::json(); };
    Trainer(c, dir.string(), hooks).run();
    return std::make_pair(order, losses_of(dir));
  };
  const auto [lagged, lagged_losses] = run(false);
  EXPECT_EQ(lagged, (std::vector<std::string>{"start 1", "start 2", "report 1", "start 3", "report 2", "start 4",
                                              "report 3", "start 5", "report 4", "start 6", "report 5", "report 6"}));
  const auto [judged, judged_losses] = run(true);
  EXPECT_EQ(judged, (std::vector<std::string>{"start 1", "report 1", "start 2", "report 2", "start 3", "report 3",
                                              "start 4", "report 4", "start 5", "report 5", "start 6", "report 6"}));
  ASSERT_EQ(lagged_losses.size(), 6u);
  EXPECT_EQ(lagged_losses, judged_losses);
  fs::remove_all(dir);
}

TEST(Training, GradientAccumulationEqualsOneLargeBatch) {
  // Two micro-batches of 4 and one micro-batch of 8 see the same 8 windows, so the first
  // step's loss and gradient norm (both taken before any update) are the same numbers,
  // summed in another order. After that, the runs are not comparable element by element:
  // AdamW's first updates are about lr * sign(g), so an element whose gradient is nearly
  // all cancellation turns a rounding difference into a full step.
  TrainHooks hooks;
  hooks.show_progress = false;
  hooks.peak_flops = 1e11;
  RunConfig accumulated = tiny_run("accumulated"), whole = tiny_run("whole");
  accumulated.schedule.steps = whole.schedule.steps = 1;
  accumulated.schedule.warmup_steps = whole.schedule.warmup_steps = 0;
  accumulated.eval.every = whole.eval.every = 0;
  whole.batch.micro_batch = 8;
  const fs::path a = fs::temp_directory_path() / ("tide_run_acc_" + std::to_string(::getpid()));
  const fs::path b = fs::temp_directory_path() / ("tide_run_whole_" + std::to_string(::getpid()));
  std::vector<StepMetrics> ma, mb;
  hooks.on_step = [&](const StepMetrics& m) { ma.push_back(m); };
  Trainer(accumulated, a.string(), hooks).run();
  hooks.on_step = [&](const StepMetrics& m) { mb.push_back(m); };
  Trainer(whole, b.string(), hooks).run();
  ASSERT_EQ(ma.size(), 1u);
  ASSERT_EQ(mb.size(), 1u);
  // The bound: an fp32 sum of K terms is off by at most K * u times the sum of their
  // magnitudes (u = 2^-24, round to nearest). The longest chain from the inputs to the
  // loss and back to a weight gradient passes D reductions, the largest of which adds
  // K = batch x seq_len = 256 positions (a weight gradient); D = 2 x (4 per block + 2).
  const double u = std::ldexp(1.0, -24);
  const double K = static_cast<double>(whole.batch.global_batch * whole.data.seq_len);
  const double D = 2.0 * (4.0 * static_cast<double>(whole.model.n_layers) + 2.0);
  const double tolerance = D * K * u;  // about 3.7e-4, relative
  EXPECT_NEAR(ma[0].loss, mb[0].loss, tolerance * std::abs(mb[0].loss));
  EXPECT_NEAR(ma[0].grad_norm, mb[0].grad_norm, tolerance * mb[0].grad_norm);
  // A wrong scale of the accumulated gradient (a sum instead of a mean) or other windows
  // would move the norm by far more than rounding: it is not a number every run shares.
  EXPECT_GT(mb[0].grad_norm, 0.0);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Training, ADropoutRunResumesWithTheMasksTheUninterruptedRunDrew) {
  // Dropout draws from the random generator, and recomputation draws the same masks a
  // second time: a resumed run equals the uninterrupted one only if the checkpoint gave
  // it back the generator's state (the trainer seeds it afresh at every start).
  RunConfig whole = tiny_run("dropout"), first = tiny_run("dropout");
  for (RunConfig* c : {&whole, &first}) {
    c->model.dropout = 0.2;
    c->model.activation_checkpointing = true;
    c->eval.every = 0;
    c->checkpoint.every = 2;
    c->checkpoint.async = false;
    c->schedule.decay = DecayKind::Constant;  // the shorter run's rates are the longer one's
  }
  first.schedule.steps = 4;
  const fs::path straight = fs::temp_directory_path() / ("tide_run_dropout_" + std::to_string(::getpid()));
  const fs::path split = fs::temp_directory_path() / ("tide_run_dropout_split_" + std::to_string(::getpid()));
  fs::remove_all(straight);
  fs::remove_all(split);
  TrainHooks hooks;
  hooks.show_progress = false;
  hooks.peak_flops = 1e11;
  std::vector<double> ref, resumed;
  hooks.on_step = [&](const StepMetrics& m) { ref.push_back(m.loss); };
  Trainer(whole, straight.string(), hooks).run();
  hooks.on_step = nullptr;
  Trainer(first, split.string(), hooks).run();
  hooks.on_step = [&](const StepMetrics& m) { resumed.push_back(m.loss); };
  hooks.resume = "auto";
  Trainer(whole, split.string(), hooks).run();
  ASSERT_EQ(ref.size(), 6u);
  ASSERT_EQ(resumed.size(), 2u);
  // The same kernels on the same state in the same order: the same bits.
  EXPECT_EQ(resumed[0], ref[4]);
  EXPECT_EQ(resumed[1], ref[5]);
  fs::remove_all(straight);
  fs::remove_all(split);
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
