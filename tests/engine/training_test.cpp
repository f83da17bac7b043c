// The training loop end to end, in this process, on a real prepared dataset.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "test_data.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/data/training_data.h"
#include "tide/engine/model/linear_cross_entropy.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/train/evaluate.h"
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

// Hooks for a run a test reads afterwards: no progress bar, a fixed peak for the MFU.
TrainHooks quiet_hooks() {
  TrainHooks h;
  h.show_progress = false;
  h.peak_flops = 1e11;
  return h;
}

std::vector<nlohmann::json> metrics_rows(const fs::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<double> losses_of(const fs::path& run) {
  std::vector<double> out;
  for (const auto& row : metrics_rows(run)) out.push_back(row["loss"].get<double>());
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
  TrainHooks hooks = quiet_hooks();
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

TEST(Training, AProgressLineGivesTheSpeedOfTheStepsSinceTheLastOne) {
  // On a GPU one step's own time is the host's, which runs ahead of the device and waits
  // for it later: the line's speed is the tokens of the steps it covers over their time.
  const fs::path dir = fs::temp_directory_path() / ("tide_run_progress_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainHooks hooks = quiet_hooks();
  RunConfig c = tiny_run("progress");
  c.log_every = 3;
  c.eval.every = 0;
  Trainer(c, dir.string(), hooks).run();
  const auto rows = metrics_rows(dir);
  ASSERT_EQ(rows.size(), 6u);
  std::map<int64_t, double> shown;  // step -> tok/s of its line in train.log
  {
    std::ifstream in(dir / "train.log");
    std::string line;
    while (std::getline(in, line)) {
      const auto at = line.find("] step ");
      const auto rate = line.find(" tok/s");
      if (at == std::string::npos || rate == std::string::npos) continue;
      const int64_t step = std::stoll(line.substr(at + 7));
      const auto bar = line.rfind("| ", rate);
      shown[step] = std::stod(line.substr(bar + 2, rate - bar - 2));
    }
  }
  ASSERT_EQ(shown.size(), 2u) << "lines at steps 3 and 6";
  for (const int64_t last : {3, 6}) {
    double seconds = 0;
    for (int64_t i = last - 3; i < last; ++i) seconds += rows[i]["step_seconds"].get<double>();
    const double tokens =
        rows[last - 1]["tokens"].get<double>() - (last > 3 ? rows[last - 4]["tokens"].get<double>() : 0.0);
    // Printed to the token: within half a token a second of the figure.
    EXPECT_NEAR(shown[last], tokens / seconds, 0.5 + 1e-9 * tokens / seconds) << "step " << last;
  }
  fs::remove_all(dir);
}

TEST(Training, LuaStyleScheduleHookDrivesTheLearningRate) {
  const fs::path dir = fs::temp_directory_path() / ("tide_run_lr_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainHooks hooks = quiet_hooks();
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
    TrainHooks hooks = quiet_hooks();
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
  TrainHooks hooks = quiet_hooks();
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

// data.eod_mask_loss: the step's loss is the mean over every counted target, not a mean
// of micro-batch means. Two micro-batches holding different counts of document ends: the
// step's reported loss is their losses (seen through the loss tap) weighted by their
// counted targets (from the loader's own samples), to fp64's rounding, which a plain
// mean of the two, or targets left counted, misses by far more; one micro-batch of all
// eight windows gives the same loss and gradient norm within the fp32 bound of
// GradientAccumulationEqualsOneLargeBatch. Validation is masked likewise: the final
// weights' masked loss, not their loss with every target counted.
TEST(Training, EodMaskLossIsTheMeanOverEveryCountedTargetHoweverTheBatchIsCut) {
  RunConfig accumulated = tiny_run("eod_accumulated");
  accumulated.data.seq_len = accumulated.model.max_seq_len = 128;  // about four document ends in a step
  accumulated.data.eod_mask_loss = true;
  accumulated.schedule.steps = 1;
  accumulated.schedule.warmup_steps = 0;
  accumulated.eval.every = 1;
  RunConfig whole = accumulated;
  whole.name = "eod_whole";
  whole.batch.micro_batch = 8;

  const TrainingData data(accumulated.data);
  const auto samples = data.train_samples(static_cast<uint64_t>(accumulated.seed));
  std::vector<double> counted;
  for (int64_t m = 0; m < 2; ++m)
    counted.push_back(make_batch(samples, 4 * m, 4, 128, BatchContents::of(accumulated.data))
                          .targets.ne(kUncountedTarget)
                          .sum()
                          .item<double>());
  ASSERT_NE(counted[0], counted[1]) << "the micro-batches hold as many document ends: nothing would be tested";
  ASSERT_LT(counted[0] + counted[1], 8 * 128.0) << "no document ends in the step";

  const auto run = [](const RunConfig& c, const fs::path& dir, std::vector<double>* micro_losses) {
    TrainHooks h = quiet_hooks();
    if (micro_losses)
      h.loss_tap = [micro_losses](int64_t, int64_t, const at::Tensor& loss) {
        micro_losses->push_back(loss.item<double>());
        return loss;
      };
    std::vector<StepMetrics> rows;
    h.on_step = [&](const StepMetrics& m) { rows.push_back(m); };
    fs::remove_all(dir);
    const TrainResult r = Trainer(c, dir.string(), h).run();
    EXPECT_EQ(rows.size(), 1u);
    EXPECT_TRUE(r.final_val_loss.has_value());
    return std::make_pair(rows.at(0), r.final_val_loss.value_or(0.0));
  };
  const fs::path a = fs::temp_directory_path() / ("tide_run_eod_acc_" + std::to_string(::getpid()));
  const fs::path b = fs::temp_directory_path() / ("tide_run_eod_whole_" + std::to_string(::getpid()));
  std::vector<double> micro;
  const auto [ma, val_a] = run(accumulated, a, &micro);
  const StepMetrics mb = run(whole, b, nullptr).first;
  ASSERT_EQ(micro.size(), 2u);

  const double weighted = (micro[0] * counted[0] + micro[1] * counted[1]) / (counted[0] + counted[1]);
  EXPECT_NEAR(ma.loss, weighted, 1e-12 * weighted);
  EXPECT_GT(std::abs((micro[0] + micro[1]) / 2 - weighted), 1e-9 * weighted) << "a mean of means would pass too";
  const double u = std::ldexp(1.0, -24);
  const double K = 8.0 * 128.0, D = 2.0 * (4.0 * static_cast<double>(whole.model.n_layers) + 2.0);
  EXPECT_NEAR(ma.loss, mb.loss, D * K * u * mb.loss);
  EXPECT_NEAR(ma.grad_norm, mb.grad_norm, D * K * u * mb.grad_norm);

  LoadedModel m = load_model(a.string());
  const TokenDataset ds(accumulated.data.path);
  const auto& val = ds.split("val");
  const double masked =
      evaluate_loss(m.model, val, 128, 4, accumulated.eval.batches, BatchContents::of(accumulated.data));
  EXPECT_DOUBLE_EQ(val_a, masked);
  EXPECT_NE(masked, evaluate_loss(m.model, val, 128, 4, accumulated.eval.batches));
  fs::remove_all(a);
  fs::remove_all(b);
}

// data.loss_mask with data.document_windows on a prompt-completion dataset: each
// micro-batch's loss is over its completions' targets alone (the loader's own samples,
// windows starting at examples, masked as BatchLoader.ALossMask… checks), and the step's
// loss weighs the two micro-batches by those counts, to fp64's rounding. Validation is
// masked likewise. A dataset without a mask is refused, naming data.path.
TEST(Training, ALossMaskTrainsOnTheCompletionsOfWholeExamples) {
  RunConfig c = tiny_run("loss_mask");
  c.data.path = testing::prompt_completion_dataset();
  c.data.seq_len = c.model.max_seq_len = 64;
  c.data.loss_mask = true;
  c.data.document_windows = true;
  c.schedule.steps = 1;
  c.schedule.warmup_steps = 0;
  c.eval.every = 1;

  const TrainingData data(c.data);
  const auto samples = data.train_samples(static_cast<uint64_t>(c.seed), /*document_windows=*/true);
  std::vector<double> counted;
  for (int64_t m = 0; m < 2; ++m)
    counted.push_back(
        make_batch(samples, 4 * m, 4, 64, BatchContents::of(c.data)).targets.ne(kUncountedTarget).sum().item<double>());
  ASSERT_NE(counted[0], counted[1]) << "the micro-batches count as many targets: nothing would be tested";
  ASSERT_LT(counted[0] + counted[1], 8 * 64.0) << "no prompt in the step";

  TrainHooks h = quiet_hooks();
  std::vector<double> micro;
  h.loss_tap = [&micro](int64_t, int64_t, const at::Tensor& loss) {
    micro.push_back(loss.item<double>());
    return loss;
  };
  std::vector<StepMetrics> rows;
  h.on_step = [&](const StepMetrics& m) { rows.push_back(m); };
  const fs::path dir = fs::temp_directory_path() / ("tide_run_loss_mask_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const TrainResult r = Trainer(c, dir.string(), h).run();
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(micro.size(), 2u);
  const double weighted = (micro[0] * counted[0] + micro[1] * counted[1]) / (counted[0] + counted[1]);
  EXPECT_NEAR(rows[0].loss, weighted, 1e-12 * weighted);

  LoadedModel m = load_model(dir.string());
  const TokenDataset ds(c.data.path);
  const double masked = evaluate_loss(m.model, ds.split("val"), 64, 4, c.eval.batches, BatchContents::of(c.data));
  ASSERT_TRUE(r.final_val_loss.has_value());
  EXPECT_DOUBLE_EQ(*r.final_val_loss, masked);
  EXPECT_NE(masked, evaluate_loss(m.model, ds.split("val"), 64, 4, c.eval.batches));
  fs::remove_all(dir);

  RunConfig unmasked = tiny_run("no_mask");  // the license texts: no loss mask
  unmasked.data.loss_mask = true;
  try {
    TrainingData refused(unmasked.data);
    ADD_FAILURE() << "a dataset without a loss mask was taken";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.path");
    EXPECT_NE(std::string(e.what()).find("has no loss mask"), std::string::npos) << e.what();
  }
}

// A run that a shorter one with the same settings, resumed, must reproduce: a checkpoint
// every two steps, written before training goes on, and a constant rate after warm-up
// (the shorter run's rates are then the longer one's).
void split_at_checkpoints(RunConfig& c) {
  c.eval.every = 0;
  c.checkpoint.every = 2;
  c.checkpoint.async = false;
  c.schedule.decay = DecayKind::Constant;
}

TEST(Training, ADropoutRunResumesWithTheMasksTheUninterruptedRunDrew) {
  // Dropout draws from the random generator, and recomputation draws the same masks a
  // second time: a resumed run equals the uninterrupted one only if the checkpoint gave
  // it back the generator's state (the trainer seeds it afresh at every start).
  RunConfig whole = tiny_run("dropout"), first = tiny_run("dropout");
  for (RunConfig* c : {&whole, &first}) {
    c->model.dropout = 0.2;
    c->model.activation_checkpointing = true;
    split_at_checkpoints(*c);
  }
  first.schedule.steps = 4;
  const fs::path straight = fs::temp_directory_path() / ("tide_run_dropout_" + std::to_string(::getpid()));
  const fs::path split = fs::temp_directory_path() / ("tide_run_dropout_split_" + std::to_string(::getpid()));
  fs::remove_all(straight);
  fs::remove_all(split);
  TrainHooks hooks = quiet_hooks();
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

// The loss scales fp16 steps used, and whether each skipped its update: one run's record.
struct ScaledSteps {
  std::vector<double> loss, scale;
  std::vector<bool> skipped, anomalous;
};

ScaledSteps train_fp16(const RunConfig& c, const fs::path& dir, const std::string& resume = "") {
  ScaledSteps out;
  TrainHooks hooks = quiet_hooks();
  hooks.resume = resume;
  hooks.on_step = [&](const StepMetrics& m) {
    out.loss.push_back(m.loss);
    out.scale.push_back(m.loss_scale);
    out.skipped.push_back(m.skipped);
    out.anomalous.push_back(!m.anomaly.empty());
  };
  Trainer(c, dir.string(), hooks).run();
  return out;
}

TEST(Training, Fp16ScalesTheLossAndTrainsAsFp32Does) {
  RunConfig fp32 = tiny_run("fp32"), fp16 = tiny_run("fp16");
  fp16.precision.compute = DType::Float16;
  const fs::path a = fs::temp_directory_path() / ("tide_run_fp32_" + std::to_string(::getpid()));
  const fs::path b = fs::temp_directory_path() / ("tide_run_fp16_" + std::to_string(::getpid()));
  const ScaledSteps ref = train_fp16(fp32, a), half = train_fp16(fp16, b);
  ASSERT_EQ(half.loss.size(), 6u);
  for (size_t i = 0; i < half.loss.size(); ++i) {
    EXPECT_EQ(ref.scale[i], 0.0) << "fp32 has no loss scale";
    EXPECT_EQ(half.scale[i], 65536.0) << "no overflow, and no 1000 steps to double it";
    EXPECT_FALSE(half.skipped[i]);
  }
  EXPECT_NEAR(half.loss[0], ref.loss[0], std::ldexp(ref.loss[0], -8));
  // fp16 keeps 11 significant bits; the loss itself is fp32. The first step's loss is the
  // same model's forward, rounded to fp16 in its products: far within 2^-8.
  // The same training, not merely a finite one: the loss falls as fp32's does, to within
  // 2% at the end (the scale divided out exactly: a power of two).
  EXPECT_LT(half.loss.back(), half.loss.front());
  EXPECT_NEAR(half.loss.back(), ref.loss.back(), 0.02 * ref.loss.back());
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Training, Fp16OverflowSkipsTheUpdateAndHalvesTheScaleWithoutAnAnomaly) {
  RunConfig c = tiny_run("overflow");
  c.precision.compute = DType::Float16;
  c.precision.initial_loss_scale = std::ldexp(1.0, 40);  // the first backwards overflow fp16
  c.precision.loss_scale_window = 2;
  c.schedule.steps = 40;
  c.eval.every = 0;
  c.anomaly.on_nonfinite = AnomalyAction::Stop;  // an overflow is the scaler's, not an anomaly
  const fs::path dir = fs::temp_directory_path() / ("tide_run_overflow_" + std::to_string(::getpid()));
  const ScaledSteps run = train_fp16(c, dir);
  ASSERT_EQ(run.loss.size(), 40u) << "the run went on";
  ASSERT_TRUE(run.skipped.front()) << "2^40 overflows fp16";
  // Each step's scale follows from the one before: halved after an overflow, doubled after
  // `window` good steps in a row.
  double expected = c.precision.initial_loss_scale;
  int64_t good = 0;
  int64_t skipped = 0;
  for (size_t i = 0; i < run.loss.size(); ++i) {
    EXPECT_EQ(run.scale[i], expected) << "step " << i + 1;
    EXPECT_FALSE(run.anomalous[i]) << "step " << i + 1;
    EXPECT_TRUE(std::isfinite(run.loss[i]));
    skipped += run.skipped[i];
    if (run.skipped[i]) {
      expected /= 2;
      good = 0;
    } else if (++good == c.precision.loss_scale_window) {
      expected *= 2;
      good = 0;
    }
  }
  EXPECT_LT(skipped, 40) << "the scale came down to one that fits";
  EXPECT_FALSE(run.skipped.back() && run.skipped[run.skipped.size() - 2]);
  fs::remove_all(dir);
}

TEST(Training, Fp16ResumesWithTheLossScaleItSaved) {
  // A window of 2 moves the scale every few steps: a resumed run matches the straight one
  // only if the checkpoint gave back the scale and its count of good steps.
  RunConfig whole = tiny_run("fp16_resume"), first = tiny_run("fp16_resume");
  for (RunConfig* c : {&whole, &first}) {
    c->precision.compute = DType::Float16;
    c->precision.initial_loss_scale = std::ldexp(1.0, 10);
    c->precision.loss_scale_window = 3;
    c->schedule.steps = 8;
    split_at_checkpoints(*c);
  }
  first.schedule.steps = 4;
  const fs::path straight = fs::temp_directory_path() / ("tide_run_fp16_straight_" + std::to_string(::getpid()));
  const fs::path split = fs::temp_directory_path() / ("tide_run_fp16_split_" + std::to_string(::getpid()));
  fs::remove_all(straight);
  fs::remove_all(split);
  const ScaledSteps ref = train_fp16(whole, straight);
  train_fp16(first, split);
  const ScaledSteps resumed = train_fp16(whole, split, "auto");
  ASSERT_EQ(ref.loss.size(), 8u);
  ASSERT_EQ(resumed.loss.size(), 4u);
  // The scale moved before the checkpoint (the test means nothing otherwise).
  // Three good steps double 2^10 before step 4; the checkpoint after it holds 2^11 and one
  // good step, not what a fresh scaler starts from.
  EXPECT_EQ(ref.scale[3], std::ldexp(1.0, 11));
  EXPECT_FALSE(ref.skipped[3]);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed.scale[i], ref.scale[4 + i]) << "step " << 5 + i;
    EXPECT_EQ(resumed.loss[i], ref.loss[4 + i]) << "step " << 5 + i;
  }
  // A manifest whose loss scale is not a positive number is refused, naming it.
  const fs::path manifest = split / "checkpoints" / "step-00000004" / "manifest.json";
  nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
  ASSERT_EQ(m["loss_scale"]["scale"].get<double>(), std::ldexp(1.0, 11));
  m["loss_scale"]["scale"] = -1;
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  try {
    train_fp16(whole, split, (split / "checkpoints" / "step-00000004").string());
    ADD_FAILURE() << "resumed from a negative loss scale";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("loss_scale"), std::string::npos) << e.what();
  }
  fs::remove_all(straight);
  fs::remove_all(split);
}

TEST(Training, Bf16AutocastTrains) {
  RunConfig c = tiny_run("bf16");
  c.precision.compute = DType::BFloat16;
  c.schedule.steps = 8;
  TrainHooks hooks = quiet_hooks();
  const fs::path dir = fs::temp_directory_path() / ("tide_run_bf16_" + std::to_string(::getpid()));
  Trainer(c, dir.string(), hooks).run();
  const auto l = losses_of(dir);
  ASSERT_EQ(l.size(), 8u);
  for (double x : l) EXPECT_TRUE(std::isfinite(x));
  EXPECT_LT(l.back(), l.front());
  fs::remove_all(dir);
}

TEST(Training, DocumentsAttendedApartTrainAndValidateSo) {
  const fs::path dir = fs::temp_directory_path() / ("tide_run_documents_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RunConfig c = tiny_run("documents");
  c.data.document_attention = true;
  c.eval.batches = 8;  // 32 windows over the validation split's paragraphs: some hold two
  const TrainResult r = Trainer(c, dir.string(), quiet_hooks()).run();
  ASSERT_TRUE(r.final_val_loss.has_value());
  // Validation masks as training does: the final weights' loss with each window's
  // documents apart, not the loss with attention across them.
  LoadedModel m = load_model(dir.string());
  const TokenDataset data(c.data.path);
  const auto& val = data.split("val");
  const double apart =
      evaluate_loss(m.model, val, c.data.seq_len, c.batch.micro_batch, c.eval.batches, BatchContents::of(c.data));
  EXPECT_DOUBLE_EQ(*r.final_val_loss, apart);
  EXPECT_NE(apart, evaluate_loss(m.model, val, c.data.seq_len, c.batch.micro_batch, c.eval.batches));
  fs::remove_all(dir);
}

TEST(Training, ABlendValidatesEachDatasetAndReportsTheirWeightedMean) {
  const fs::path dir = fs::temp_directory_path() / ("tide_run_blend_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RunConfig c = tiny_run("blend");
  c.data.path.clear();
  const std::string gnu = testing::license_dataset("gnu", {"GPL-2", "LGPL-2.1"}, "bytes");
  c.data.blend = {{testing::small_dataset(), 3.0, "three"}, {gnu, 1.0, ""}};
  const TrainResult r = Trainer(c, dir.string(), quiet_hooks()).run();
  const auto rows = metrics_rows(dir);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_FALSE(rows[1].contains("val_losses"));  // step 2: no validation
  const auto& last = rows.back();
  ASSERT_TRUE(last.contains("val_losses")) << last.dump();
  const double three = last["val_losses"]["three"], ds = last["val_losses"]["ds"];
  // The mean weighted as the datasets are drawn: 3 to 1.
  EXPECT_DOUBLE_EQ(last["val_loss"].get<double>(), 0.75 * three + 0.25 * ds);
  EXPECT_DOUBLE_EQ(*r.final_val_loss, last["val_loss"].get<double>());
  // Each is the loss of the final weights on that dataset's validation split.
  LoadedModel m = load_model(dir.string());
  const TokenDataset small(testing::small_dataset()), other(gnu);
  EXPECT_DOUBLE_EQ(three,
                   evaluate_loss(m.model, small.split("val"), c.data.seq_len, c.batch.micro_batch, c.eval.batches));
  EXPECT_DOUBLE_EQ(ds, evaluate_loss(m.model, other.split("val"), c.data.seq_len, c.batch.micro_batch, c.eval.batches));
  EXPECT_NE(three, ds);
  std::ifstream log(dir / "train.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("data blend: three 75.0% ("), std::string::npos) << text;
  fs::remove_all(dir);

  // Datasets of different tokenizers are not a blend: the same id would be another token.
  c.data.blend[1].path = testing::license_dataset("gnu_bpe", {"GPL-2", "LGPL-2.1"}, "bpe", 300);
  try {
    const Trainer refused(c, dir.string(), quiet_hooks());
    ADD_FAILURE() << "a blend of two tokenizers was taken";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.blend[2]");
    EXPECT_NE(std::string(e.what()).find("is not data.blend[1]'s"), std::string::npos) << e.what();
  }
  // A dataset that is not there is named with its field.
  c.data.blend[1].path = gnu;
  c.data.blend[0].path = dir.string() + "/missing";
  try {
    const Trainer refused(c, dir.string(), quiet_hooks());
    ADD_FAILURE() << "a missing dataset was taken";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "data.blend[1]");
    EXPECT_NE(std::string(e.what()).find("is not a prepared dataset"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Training, VocabularySmallerThanTheDataIsRefused) {
  RunConfig c = tiny_run("small_vocab");
  c.model.vocab_size = 100;
  EXPECT_THROW(Trainer(c, (fs::temp_directory_path() / "tide_never").string()), std::exception);
}

}  // namespace
}  // namespace tide
