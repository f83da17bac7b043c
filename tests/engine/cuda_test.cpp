// Training on a CUDA device against training on the CPU, in this process. Every test
// skips where no CUDA device is present (ctest label `cuda`; docs/gpu.md).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "cuda_skip.h"
#include "hf_reference.h"
#include "recompute_pair.h"
#include "test_data.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/model/attention_masks.h"
#include "tide/engine/model/hf_convert.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/train/evaluate.h"
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/trainer.h"
#include "tiny_models.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

RunConfig tiny_run(const std::string& device, int64_t steps) {
  RunConfig c = testing::tiny_byte_run("cuda-" + device);
  c.device = device;
  c.precision.compute = DType::Float32;  // the comparisons below are fp32 ones (auto is bf16 on CUDA)
  c.optimizer.lr = 3e-3;
  c.schedule.steps = steps;
  c.schedule.warmup_steps = 0;
  // A constant rate: a run of fewer steps takes the same steps as a longer one, so a
  // resumed run can be compared with a straight one.
  c.schedule.decay = DecayKind::Constant;
  return c;
}

fs::path run_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("tide_cuda_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::vector<StepMetrics> train(const RunConfig& c, const fs::path& dir, const std::string& resume = "") {
  TrainHooks hooks;
  hooks.show_progress = false;
  hooks.peak_flops = 1e12;
  hooks.resume = resume;
  std::vector<StepMetrics> seen;
  hooks.on_step = [&](const StepMetrics& m) { seen.push_back(m); };
  Trainer(c, dir.string(), hooks).run();
  return seen;
}

// Two fp32 evaluations that differ only in the order of their sums (cuBLAS against the
// CPU's kernels): a sum of K terms is off by at most K u times the sum of the terms'
// magnitudes (u = 2^-24); the longest chain from the data to a weight gradient passes
// D = 2 x (4 per block + 2) sums, the longest of which adds K = batch x seq_len terms.
double rounding_bound(const RunConfig& c) {
  const double u = std::ldexp(1.0, -24);
  const double K = static_cast<double>(c.batch.global_batch * c.data.seq_len);
  const double D = 2.0 * (4.0 * static_cast<double>(c.model.n_layers) + 2.0);
  return D * K * u;
}

TEST(Cuda, FirstStepEqualsTheCpuStepFromTheSameInitialValues) {
  SKIP_WITHOUT_CUDA();
  // The model is initialised on the host in both runs, so step 1's loss and gradient norm
  // (taken before any update) are the same numbers up to the order of the sums. Later
  // steps are not compared element by element: AdamW's first updates are about
  // lr * sign(g), which turns a rounding difference in a near-zero gradient into a step.
  const RunConfig cpu = tiny_run("cpu", 1), cuda = tiny_run("cuda", 1);
  const auto a = train(cpu, run_dir("ref")), b = train(cuda, run_dir("dev"));
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  const double tol = rounding_bound(cpu);
  EXPECT_NEAR(b[0].loss, a[0].loss, tol * a[0].loss);
  EXPECT_NEAR(b[0].grad_norm, a[0].grad_norm, tol * a[0].grad_norm);
  EXPECT_GT(b[0].peak_gpu_mb, 0.0) << "peak device memory is reported on CUDA";
  fs::remove_all(run_dir("ref"));
  fs::remove_all(run_dir("dev"));
}

TEST(Cuda, ARecipeThatSaysNothingTrainsInBf16AndRecordsIt) {
  SKIP_WITHOUT_CUDA();
  RunConfig c = tiny_run("cuda", 1);
  c.precision.compute = DType::Auto;
  const fs::path dir = run_dir("auto");
  train(c, dir);
  std::ifstream in(dir / "config.json");
  EXPECT_EQ(nlohmann::json::parse(in)["precision"]["compute"], "bf16");
  fs::remove_all(dir);
}

TEST(Cuda, Bf16TrainsToWithinOnePercentOfFp32) {
  SKIP_WITHOUT_CUDA();
  RunConfig fp32 = tiny_run("cuda", 200), bf16 = tiny_run("cuda", 200);
  fp32.schedule.decay = bf16.schedule.decay = DecayKind::Cosine;  // both settle as the rate decays
  bf16.precision.compute = DType::BFloat16;
  const auto a = train(fp32, run_dir("fp32")), b = train(bf16, run_dir("bf16"));
  ASSERT_EQ(a.size(), 200u);
  ASSERT_EQ(b.size(), 200u);
  EXPECT_NEAR(b.back().loss, a.back().loss, 0.01 * a.back().loss);
  fs::remove_all(run_dir("fp32"));
  fs::remove_all(run_dir("bf16"));
}

TEST(Cuda, Fp16WithItsLossScaleTrainsToWithinOnePercentOfFp32) {
  SKIP_WITHOUT_CUDA();
  // fp16's 11 significant bits against bf16's 8, its range kept by the dynamic loss
  // scale: the bar is bf16's. An overflow skips a step and halves the scale, so the
  // scale only ever holds powers of two, and every step has one.
  RunConfig fp32 = tiny_run("cuda", 200), fp16 = tiny_run("cuda", 200);
  fp32.schedule.decay = fp16.schedule.decay = DecayKind::Cosine;
  fp16.precision.compute = DType::Float16;
  const auto a = train(fp32, run_dir("fp32-ref")), b = train(fp16, run_dir("fp16"));
  ASSERT_EQ(a.size(), 200u);
  ASSERT_EQ(b.size(), 200u);
  int skipped = 0;
  for (const StepMetrics& m : b) {
    int exponent = 0;
    EXPECT_EQ(std::frexp(m.loss_scale, &exponent), 0.5) << "step " << m.step << ": scale " << m.loss_scale;
    skipped += m.skipped ? 1 : 0;
    EXPECT_TRUE(m.anomaly.empty()) << "step " << m.step << ": an overflow is not an anomaly";
  }
  // Each skipped step halves the scale from 2^16; at a scale of 1 an fp16 gradient
  // overflows only past 65504, which a run that trains never reaches.
  EXPECT_LE(skipped, 16);
  EXPECT_NEAR(b.back().loss, a.back().loss, 0.01 * a.back().loss);
  fs::remove_all(run_dir("fp32-ref"));
  fs::remove_all(run_dir("fp16"));
}

// Trains `whole` (8 steps) straight, and again as 6 steps that keep only their last
// checkpoint plus a resume from it: the two runs' last two losses are the same numbers.
void expect_exact_resume(RunConfig whole, const std::string& name) {
  RunConfig first = whole;
  first.schedule.steps = 6;
  first.checkpoint.every = whole.checkpoint.every = 2;
  first.checkpoint.keep_last = whole.checkpoint.keep_last = 1;
  first.checkpoint.async = whole.checkpoint.async = false;
  const fs::path straight = run_dir(name + "_straight"), split = run_dir(name + "_split");
  const auto ref = train(whole, straight);
  train(first, split);
  // keep_last = 1: the prune left only the newest checkpoint.
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(split / "checkpoints"))
    if (e.is_directory()) kept.push_back(e.path().filename().string());
  EXPECT_EQ(kept, std::vector<std::string>{"step-00000006"});
  const auto resumed = train(whole, split, "auto");
  ASSERT_EQ(resumed.size(), 2u);
  ASSERT_EQ(ref.size(), 8u);
  // The same device, the same kernels, the same state: the same numbers.
  EXPECT_EQ(resumed[0].loss, ref[6].loss);
  EXPECT_EQ(resumed[1].loss, ref[7].loss);
  fs::remove_all(straight);
  fs::remove_all(split);
}

TEST(Cuda, BatchesForAGpuComeInPageLockedMemoryWithTheSameTokens) {
  SKIP_WITHOUT_CUDA();
  // Page-locked, their copy to the GPU is queued behind the step before, not waited for.
  const TokenDataset ds(testing::small_dataset());
  const auto& split = ds.split("train");
  for (const int64_t prefetch : {0, 2}) {
    BatchLoader pinned(SampleSource(split, 9), 4, 16, 0, prefetch, 0, 0, /*pin=*/true),
        plain(SampleSource(split, 9), 4, 16, 0, prefetch);
    for (int i = 0; i < 3; ++i) {
      const Batch a = pinned.next(), b = plain.next();
      EXPECT_TRUE(a.tokens.is_pinned() && a.targets.is_pinned()) << "prefetch " << prefetch;
      EXPECT_FALSE(b.tokens.is_pinned());
      EXPECT_TRUE(torch::equal(a.tokens, b.tokens) && torch::equal(a.targets, b.targets)) << "batch " << i;
    }
  }
}

TEST(Cuda, SavesPrunesAndResumesExactly) {
  SKIP_WITHOUT_CUDA();
  expect_exact_resume(tiny_run("cuda", 8), "plain");
}

TEST(Cuda, RecomputationAndResumeDrawTheForwardsDropoutMasks) {
  SKIP_WITHOUT_CUDA();
  // Dropout on CUDA draws from the GPU's own generator, not the CPU's: recomputation
  // must put that generator back to draw the forward's masks again, and a checkpoint
  // must carry its state (rng|cuda) for a resumed run to draw what the straight one did.
  ModelConfig config = testing::tiny_llama();
  config.dropout = 0.2;
  const auto run = testing::with_and_without_recompute(config, torch::kCUDA);
  EXPECT_EQ(run.plain_loss, run.checkpointed_loss);  // the same forward kernels on the same masks
  // Backward may sum in another order (atomic adds in attention's backward). In fp32 a
  // sum of K terms moves by at most K u of their magnitudes, over D sums on the way to a
  // weight (K = 32 positions, D = 2 x (4 x 2 + 2), u = 2^-24): about 4e-5. The bound
  // below leaves 25 times that for cancellation; a mask drawn afresh changes which fifth
  // of the activations is dropped and moves every gradient by tens of percent.
  auto pb = run.checkpointed->named_parameters();
  for (const auto& item : run.plain->named_parameters()) {
    const auto& ga = item.value().grad();
    const auto& gb = pb[item.key()].grad();
    ASSERT_TRUE(gb.defined()) << item.key();
    EXPECT_LE((ga - gb).norm().item<double>(), 1e-3 * ga.norm().item<double>()) << item.key();
  }
  RunConfig c = tiny_run("cuda", 8);
  c.model.dropout = 0.2;
  c.model.activation_checkpointing = true;
  expect_exact_resume(c, "dropout");
}

TEST(Cuda, CapturedStepsTrainAsStepsLaunchedOneKernelAtATime) {
  SKIP_WITHOUT_CUDA();
  // A graph changes when the kernels are launched, not what they compute: the same
  // kernels on the same values give the same bits, step after step. The update's inputs
  // change every step here (warmup, clipping), the forward and backward hold two
  // micro-batches and recomputation, and evaluation runs between replays; fp32, bf16
  // (with data.eod_mask_loss), and fp16, whose loss scale is updated on the device inside
  // the captured update.
  for (const DType compute : {DType::Float32, DType::BFloat16, DType::Float16}) {
    RunConfig captured = tiny_run("cuda", 10);
    captured.precision.compute = compute;
    captured.schedule.warmup_steps = 4;
    captured.schedule.decay = DecayKind::Cosine;  // a new rate at every replay
    captured.optimizer.grad_clip = 0.5;
    captured.batch.global_batch = 2 * captured.batch.micro_batch;
    captured.model.activation_checkpointing = true;
    captured.eval.every = 5;  // evaluation runs between replays, on the weights they updated
    // bf16 with document ends left out of the loss: each replay counts its own batches'
    // targets on the device (counts baked into the graph would weigh later steps wrongly).
    captured.data.eod_mask_loss = compute == DType::BFloat16;
    RunConfig launched = captured;
    launched.cuda_graphs = false;
    const std::string name = dtype_name(compute);
    TrainHooks hooks;
    hooks.show_progress = false;
    hooks.peak_flops = 1e12;
    std::vector<StepMetrics> a, b;
    hooks.on_step = [&](const StepMetrics& m) { a.push_back(m); };
    const TrainResult ra = Trainer(launched, run_dir("launched-" + name).string(), hooks).run();
    hooks.on_step = [&](const StepMetrics& m) { b.push_back(m); };
    const TrainResult rb = Trainer(captured, run_dir("captured-" + name).string(), hooks).run();
    EXPECT_EQ(ra.replayed_steps, 0) << name;
    EXPECT_EQ(rb.replayed_steps, 7) << name << ": steps 1 to 3 run as called, 4 is captured, 4 to 10 replay";
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(b.size(), 10u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(b[i].loss, a[i].loss) << name << " step " << i + 1;
      EXPECT_EQ(b[i].grad_norm, a[i].grad_norm) << name << " step " << i + 1;
    }
    ASSERT_TRUE(ra.final_val_loss && rb.final_val_loss);
    EXPECT_EQ(*rb.final_val_loss, *ra.final_val_loss) << name;
    fs::remove_all(run_dir("launched-" + name));
    fs::remove_all(run_dir("captured-" + name));
  }
}

// The launch table's rows from a profile summary file: (name, seconds).
std::vector<std::pair<std::string, double>> launch_rows(const fs::path& summary) {
  std::ifstream in(summary);
  std::vector<std::pair<std::string, double>> rows;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("device time by the operator that launched it", 0) == 0) {
      inside = true;
      std::getline(in, line);  // the column names
      continue;
    }
    if (!inside) continue;
    std::istringstream fields(line);
    double seconds = 0;
    std::string share;
    int64_t events = 0;
    if (!(fields >> seconds >> share >> events)) break;
    std::string name;
    std::getline(fields >> std::ws, name);
    rows.emplace_back(name, seconds);
  }
  return rows;
}

TEST(Cuda, AProfileNamesTheOperatorsThatLaunchedTheKernels) {
  SKIP_WITHOUT_CUDA();
  // Kineto links each kernel to the operator it was launched in: the summary's launch
  // table must name operators for most of the device's time, tide's fused nodes among them.
  RunConfig c = tiny_run("cuda", 4);
  c.precision.compute = DType::BFloat16;
  c.cuda_graphs = false;  // a replayed graph's kernels all name the one launch
  c.profile.start_step = 3;
  c.profile.steps = 2;
  const fs::path dir = run_dir("profiled");
  train(c, dir);
  const auto rows = launch_rows(dir / "profile" / "steps-3-4-rank-0.summary.txt");
  ASSERT_FALSE(rows.empty()) << "no launch table in the summary";
  double named = 0, unnamed = 0;
  bool saw_norm_node = false;
  for (const auto& [name, seconds] : rows) {
    (name == "(no operator recorded)" ? unnamed : named) += seconds;
    saw_norm_node |= name.find("tide::normed_projections") != std::string::npos;
  }
  EXPECT_GT(named, unnamed) << "most device time has no launching operator";
  // Its forward scope (RECORD_FUNCTION), not only the step's annotation.
  EXPECT_TRUE(saw_norm_node) << "no row names tide::normed_projections";
  fs::remove_all(dir);
}

TEST(Cuda, ACheckpointMovesBetweenCudaAndCpu) {
  SKIP_WITHOUT_CUDA();
  // 4 steps on CUDA, then step 5 on the CPU from its checkpoint, and the other way round:
  // each resumed step starts from the state the other device saved, so its loss is the
  // straight run's up to the order of the sums.
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"cuda", "cpu"}, {"cpu", "cuda"}}) {
    RunConfig first = tiny_run(from, 4), whole = tiny_run(from, 5), moved = tiny_run(to, 5);
    first.checkpoint.async = false;
    const fs::path straight = run_dir("straight_" + from), split = run_dir("moved_" + from);
    const auto ref = train(whole, straight);
    train(first, split);
    const auto resumed = train(moved, split, "auto");
    ASSERT_EQ(resumed.size(), 1u) << from << " -> " << to;
    EXPECT_NEAR(resumed[0].loss, ref[4].loss, rounding_bound(whole) * ref[4].loss) << from << " -> " << to;
    fs::remove_all(straight);
    fs::remove_all(split);
  }
}

TEST(Cuda, ExportOfACudaTrainedModelLoadsInTransformersWithItsLogits) {
  SKIP_WITHOUT_CUDA();
  // Trained and saved on the GPU, loaded, moved back to it and exported from there:
  // transformers' logits of the export are tide's on the GPU, up to the order of the sums.
  const RunConfig c = tiny_run("cuda", 5);
  const fs::path dir = run_dir("export"), hf = run_dir("export_hf");
  train(c, dir);
  LoadedModel m = load_model(dir.string());
  m.model->to(torch::Device(torch::kCUDA, 0));
  m.model->eval();
  export_hf(hf.string(), m.model);
  const auto ids = torch::randint(0, c.model.vocab_size, {2, 16}, torch::kInt64);
  const fs::path out = hf / "reference.safetensors";
  SafetensorsWriter writer;
  writer.add("input_ids", "I64", {ids.size(0), ids.size(1)}, ids.data_ptr(), static_cast<size_t>(ids.nbytes()));
  writer.write(out.string());
  testing::run_hf_reference("logits " + hf.string() + " " + out.string());
  const SafetensorsReader ref(out.string());
  const auto expected = testing::read_named(ref, "logits");
  torch::NoGradGuard no_grad;
  const auto logits = m.model->forward(ids.to(torch::kCUDA)).cpu();
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_LE((logits - expected).abs().max().item<double>(),
            testing::logit_tolerance(c.model, ids.size(1), expected));
  fs::remove_all(dir);
  fs::remove_all(hf);
}

// A window attended in parts on CUDA in bf16 (the blocks' SDPA call takes their band
// mask, so the memory-efficient kernel runs it) against the whole mask's attention in fp64
// on the CPU from the same bf16 inputs, with and without documents apart: within
// AttentionKernel's bf16 bound (about 8 roundings of 2^-8 each).
TEST(Cuda, AWindowAttendedInPartsIsTheWholeMasksAttentionInBf16) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(41);
  const int64_t b = 2, h = 8, kv = 2, t = 1024, hd = 64, window = 128;
  const torch::Device gpu(torch::kCUDA, 0);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const auto q = torch::randn({b, h, t, hd}, bf16), k = torch::randn({b, kv, t, hd}, bf16);
  const auto v = torch::randn({b, kv, t, hd}, bf16), g = torch::randn({b, h, t, hd}, bf16);
  auto documents = torch::zeros({b, t}, torch::kInt64);
  documents[0].narrow(0, 300, t - 300).fill_(1);
  const auto relative = [](const torch::Tensor& got, const torch::Tensor& want) {
    return ((got.cpu().to(torch::kFloat64) - want).norm() / want.norm()).item<double>();
  };
  const double bound = 8.0 * std::ldexp(1.0, -8);
  for (const bool docs : {false, true}) {
    SCOPED_TRACE(docs ? "documents apart" : "one sequence");
    auto qg = q.to(gpu).requires_grad_(), kg = k.to(gpu).requires_grad_(), vg = v.to(gpu).requires_grad_();
    const auto parts = windowed_attention_parts(t, window, window_block_rows(window),
                                                docs ? documents.to(gpu) : torch::Tensor(), {}, qg.options());
    const PartAttention attend = [](const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp,
                                    const at::Tensor& mask) {
      return at::scaled_dot_product_attention(qp, kp, vp,
                                              mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, 0.0,
                                              !mask.defined(), std::nullopt, /*enable_gqa=*/true);
    };
    const auto out = windowed_attention(qg, kg, vg, parts, attend);
    const auto grads = torch::autograd::grad({out}, {qg, kg, vg}, {g.to(gpu)});

    auto q64 = q.to(torch::kFloat64).requires_grad_(), k64 = k.to(torch::kFloat64).requires_grad_();
    auto v64 = v.to(torch::kFloat64).requires_grad_();
    const auto i = torch::arange(t).unsqueeze(1), j = torch::arange(t).unsqueeze(0);
    auto allowed = j.le(i).logical_and(i.sub(j).lt(window)).view({1, 1, t, t});
    if (docs) allowed = allowed.logical_and(documents.unsqueeze(2).eq(documents.unsqueeze(1)).unsqueeze(1));
    const auto scores = torch::matmul(q64, k64.repeat_interleave(h / kv, 1).transpose(-1, -2)) / std::sqrt(64.0);
    const auto want = torch::matmul(scores.masked_fill(allowed.logical_not(), -INFINITY).softmax(-1),
                                    v64.repeat_interleave(h / kv, 1));
    const auto want_grads = torch::autograd::grad({want}, {q64, k64, v64}, {g.to(torch::kFloat64)});
    EXPECT_LT(relative(out, want.detach()), bound);
    for (size_t n = 0; n < 3; ++n) EXPECT_LT(relative(grads[n], want_grads[n]), bound) << "gradient " << n;
  }
}

TEST(Cuda, GreedyGenerationChoosesWhatTheCpuWouldUpToRounding) {
  SKIP_WITHOUT_CUDA();
  // Every token the GPU picks greedily is, by the CPU's logits for the same context, the
  // largest or within twice the rounding bound of it (a near-tie may go either way).
  const ModelConfig config = testing::tiny_llama();
  Transformer model(config);
  model->reset_parameters(5);
  model->to(torch::Device(torch::kCUDA, 0));
  const std::vector<int32_t> prompt{3, 14, 15, 92, 65};
  SampleOptions opt;
  opt.temperature = 0;
  opt.max_new_tokens = config.max_seq_len - static_cast<int64_t>(prompt.size());
  const auto generated = sample(model, prompt, opt);
  ASSERT_EQ(static_cast<int64_t>(generated.size()), opt.max_new_tokens);
  model->to(torch::kCPU);
  std::vector<int64_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), generated.begin(), generated.end());
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(torch::tensor(all, torch::kInt64).view({1, -1}))[0];  // [T, V]
  const double tol = testing::logit_tolerance(config, static_cast<int64_t>(all.size()), logits);
  for (size_t i = 0; i < generated.size(); ++i) {
    const auto row = logits[static_cast<int64_t>(prompt.size() + i) - 1];
    const double best = row.max().item<double>(), chosen = row[generated[i]].item<double>();
    EXPECT_GE(chosen, best - 2 * tol) << "token " << i << ": the GPU chose " << generated[i] << " (logit " << chosen
                                      << "), the CPU's largest logit is " << best;
  }
}

}  // namespace
}  // namespace tide
