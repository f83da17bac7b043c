// tide against the real transformers (tests/engine/hf_reference.py, run in the project's
// .venv): checkpoints written by transformers import into tide with transformers' logits
// and greedy continuation, and a tide export loads in AutoModelForCausalLM with tide's logits.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/hf_convert.h"
#include "tide/engine/model/weights_io.h"
#include "tide/engine/train/evaluate.h"
#include "tiny_models.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

const std::string kScript = std::string(TIDE_SOURCE_DIR) + "/tests/engine/hf_reference.py";

void run_reference(const std::string& args) {
  const std::string cmd = std::string(TIDE_PYTHON) + " " + kScript + " " + args + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

torch::Tensor tensor(const SafetensorsReader& f, const std::string& name) {
  const SafetensorsEntry* e = f.find(name);
  if (!e) throw std::runtime_error(f.path() + " has no " + name);
  return read_tensor(f, *e);
}

// How far two fp32 evaluations of the same logits may lie apart when they differ only in
// the order of their sums (tide's kernels against transformers'). A sum of K terms in
// fp32 is off by at most K u times the sum of the terms' magnitudes (u = 2^-24); the
// longest chain from the ids to a logit passes D = 4 per block + 2 such sums, the longest
// of which adds K = max(dim, ffn, positions) terms. With weights drawn at random the
// terms' signs are random, so their magnitudes sum to about sqrt(K) times the result:
// the bound is D K u sqrt(K) times the largest logit.
double logit_tolerance(const ModelConfig& m, int64_t positions, const torch::Tensor& logits) {
  const double u = std::ldexp(1.0, -24);
  const double K = static_cast<double>(std::max({m.dim, resolved_ffn_dim(m), positions}));
  const double D = 4.0 * static_cast<double>(m.n_layers) + 2.0;
  return D * K * u * std::sqrt(K) * logits.abs().max().item<double>();
}

class HfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReference, ImportedCheckpointGivesTransformersLogitsAndGreedyContinuation) {
  const fs::path root = fs::temp_directory_path() / ("tide_hf_reference_" + GetParam() + std::to_string(::getpid()));
  fs::remove_all(root);
  run_reference("make " + root.string());
  const fs::path dir = root / GetParam();
  Transformer model = import_hf(dir.string());
  model->eval();
  SafetensorsReader ref((dir / "reference.safetensors").string());
  const auto ids = tensor(ref, "input_ids"), expected = tensor(ref, "logits");
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(ids);
  ASSERT_EQ(logits.sizes(), expected.sizes());
  const double tol = logit_tolerance(model->config(), ids.size(1), expected);
  EXPECT_LE((logits - expected).abs().max().item<double>(), tol) << GetParam();

  // Greedy decoding: no choice transformers made was a near-tie (checked), so tide's
  // continuation must be the same tokens.
  const double margin = tensor(ref, "greedy_margin").item<double>();
  ASSERT_GT(margin, 2 * tol) << "the reference model has near-ties; the comparison would not be sound";
  const auto greedy = tensor(ref, "greedy");
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < ids.size(1); ++i) prompt.push_back(static_cast<int32_t>(ids[0][i].item<int64_t>()));
  SampleOptions opt;
  opt.temperature = 0;
  opt.max_new_tokens = greedy.numel();
  const auto ours = sample(model, prompt, opt);
  std::vector<int64_t> theirs(greedy.data_ptr<int64_t>(), greedy.data_ptr<int64_t>() + greedy.numel());
  EXPECT_EQ(std::vector<int64_t>(ours.begin(), ours.end()), theirs) << GetParam();
  fs::remove_all(root);
}

TEST_P(HfReference, ExportLoadsInTransformersWithTidesLogits) {
  const ModelConfig config = GetParam() == "llama" ? testing::tiny_llama() : testing::tiny_bloom();
  torch::manual_seed(3);
  Transformer model(config);
  model->reset_parameters(1);
  model->eval();
  const fs::path dir = fs::temp_directory_path() / ("tide_hf_export_" + GetParam() + std::to_string(::getpid()));
  fs::remove_all(dir);
  export_hf(dir.string(), model);
  const auto ids = torch::randint(0, config.vocab_size, {2, 16}, torch::kInt64);
  const fs::path out = dir / "reference.safetensors";
  SafetensorsWriter writer;
  writer.add("input_ids", "I64", {ids.size(0), ids.size(1)}, ids.data_ptr(), static_cast<size_t>(ids.nbytes()));
  writer.write(out.string());
  run_reference("logits " + dir.string() + " " + out.string());
  SafetensorsReader ref(out.string());
  const auto expected = tensor(ref, "logits");
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(ids);
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_LE((logits - expected).abs().max().item<double>(), logit_tolerance(config, ids.size(1), expected));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfReference, ::testing::Values("llama", "bloom"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tide
