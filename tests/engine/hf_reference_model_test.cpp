// tide against the real transformers (tests/engine/hf_reference.py, run in the project's
// .venv): checkpoints written by transformers import into tide with transformers' logits
// and greedy continuation, and a tide export loads in AutoModelForCausalLM with tide's logits.
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "hf_reference.h"
#include "tide/engine/model/hf_convert.h"
#include "tide/engine/train/evaluate.h"
#include "tiny_models.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

using testing::logit_tolerance;
using testing::read_named;
using testing::run_hf_reference;

class HfReference : public ::testing::TestWithParam<std::string> {};

// The shapes hf_reference.py makes, by name.
ModelConfig tiny_model(const std::string& name) {
  if (name == "bloom") return testing::tiny_bloom();
  ModelConfig m = testing::tiny_llama();
  if (name == "llama3") {
    m.rope_scaling = RopeScaling::Llama3;
    m.rope_original_max_seq_len = 16;  // the rest: Llama 3.1's (factor 8, frequency factors 1 and 4)
  } else if (name == "llama_yarn") {
    m.rope_scaling = RopeScaling::Yarn;
    m.rope_scaling_factor = 4;
    m.rope_beta_slow = 0.01;
    m.rope_original_max_seq_len = 16;
  } else if (name == "llama_linear") {
    m.rope_scaling = RopeScaling::Linear;
    m.rope_scaling_factor = 4;
  } else if (name == "qwen2") {
    m.qkv_bias = true;
  } else if (name == "mistral_wide_heads") {
    m.head_dim = 16;
  } else if (name == "qwen3") {
    m.head_dim = 16;
    m.qk_norm = true;
  } else if (name == "mistral_window") {
    m.sliding_window = 6;
  } else if (name == "qwen2_window") {
    m.qkv_bias = true;
    m.sliding_window = 5;
  } else if (name == "qwen2_mixed") {
    m.qkv_bias = true;
    m.sliding_window = 5;
    m.full_attention_layers = {0};
  } else if (name == "gemma") {
    m = testing::tiny_gemma();
  } else if (name == "gemma2") {
    m = testing::tiny_gemma();
    m.post_norms = true;
    m.softmax_scale = 0.20412414523193154;  // 1 / sqrt(24)
    m.sliding_window = 5;
    m.full_attention_layers = {1};
    m.attention_softcap = 1;
    m.final_logit_softcap = 3;
  } else if (name == "mixtral") {
    m = testing::tiny_moe();
    m.ffn_dim = 96;
  } else if (name == "qwen3_moe") {
    m = testing::tiny_moe();
    m.ffn_dim = 48;
    m.head_dim = 16;
    m.qk_norm = true;
    m.moe_normalize_top_k = false;
  } else if (name == "qwen2_moe") {
    m = testing::tiny_moe();
    m.ffn_dim = 48;
    m.qkv_bias = true;
    m.moe_normalize_top_k = false;
    m.moe_shared_ffn_dim = 64;
    m.moe_shared_gate = true;
  } else if (name == "gemma3") {
    m = testing::tiny_gemma3();
  } else if (name == "gemma3_window") {
    m = testing::tiny_gemma3();
    m.sliding_window = 5;
    m.rope_theta = 1e6;         // the full layers' (there are none)
    m.rope_local_theta = 1000;  // the window's layers' RoPE base
  } else if (name == "gemma3_mixed" || name == "gemma3_multimodal") {
    m = testing::tiny_gemma3();
    m.sliding_window = 5;
    m.full_attention_layers = {1};
    m.rope_theta = 1e6;
    m.rope_scaling = RopeScaling::Linear;
    m.rope_scaling_factor = 2;
    m.rope_local_theta = 1000;
  }
  return m;
}

TEST_P(HfReference, ImportedCheckpointGivesTransformersLogitsAndGreedyContinuation) {
  const fs::path root = fs::temp_directory_path() / ("tide_hf_reference_" + GetParam() + std::to_string(::getpid()));
  fs::remove_all(root);
  run_hf_reference("make " + root.string() + " " + GetParam());
  const fs::path dir = root / GetParam();
  Transformer model = import_hf(dir.string());
  model->eval();
  EXPECT_EQ(model->config().sliding_window, tiny_model(GetParam()).sliding_window);
  EXPECT_EQ(model->config().qkv_bias, tiny_model(GetParam()).qkv_bias);
  EXPECT_EQ(model->config().head_dim, tiny_model(GetParam()).head_dim);
  EXPECT_EQ(model->config().qk_norm, tiny_model(GetParam()).qk_norm);
  EXPECT_EQ(model->config().mlp, tiny_model(GetParam()).mlp);
  EXPECT_EQ(model->config().norm_zero_centered, tiny_model(GetParam()).norm_zero_centered);
  EXPECT_EQ(model->config().embedding_scale, tiny_model(GetParam()).embedding_scale);
  EXPECT_EQ(model->config().tie_embeddings, tiny_model(GetParam()).tie_embeddings);
  EXPECT_EQ(model->config().post_norms, tiny_model(GetParam()).post_norms);
  EXPECT_EQ(model->config().softmax_scale, tiny_model(GetParam()).softmax_scale);
  EXPECT_EQ(model->config().rope_theta, tiny_model(GetParam()).rope_theta);
  EXPECT_EQ(model->config().full_attention_layers, tiny_model(GetParam()).full_attention_layers);
  EXPECT_EQ(model->config().rope_local_theta, tiny_model(GetParam()).rope_local_theta);
  EXPECT_EQ(model->config().rope_scaling, tiny_model(GetParam()).rope_scaling);
  EXPECT_EQ(model->config().attention_softcap, tiny_model(GetParam()).attention_softcap);
  EXPECT_EQ(model->config().final_logit_softcap, tiny_model(GetParam()).final_logit_softcap);
  EXPECT_EQ(model->config().moe_experts, tiny_model(GetParam()).moe_experts);
  EXPECT_EQ(model->config().moe_top_k, tiny_model(GetParam()).moe_top_k);
  EXPECT_EQ(model->config().moe_normalize_top_k, tiny_model(GetParam()).moe_normalize_top_k);
  EXPECT_EQ(model->config().moe_shared_ffn_dim, tiny_model(GetParam()).moe_shared_ffn_dim);
  EXPECT_EQ(model->config().moe_shared_gate, tiny_model(GetParam()).moe_shared_gate);
  EXPECT_EQ(resolved_ffn_dim(model->config()), resolved_ffn_dim(tiny_model(GetParam())));
  SafetensorsReader ref((dir / "reference.safetensors").string());
  const auto ids = read_named(ref, "input_ids"), expected = read_named(ref, "logits");
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(ids);
  ASSERT_EQ(logits.sizes(), expected.sizes());
  const double tol = logit_tolerance(model->config(), ids.size(1), expected);
  EXPECT_LE((logits - expected).abs().max().item<double>(), tol) << GetParam();

  // Greedy decoding: no choice transformers made was a near-tie (checked), so tide's
  // continuation must be the same tokens.
  const double margin = read_named(ref, "greedy_margin").item<double>();
  ASSERT_GT(margin, 2 * tol) << "the reference model has near-ties; the comparison would not be sound";
  const auto greedy = read_named(ref, "greedy");
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
  if (GetParam() == "mistral")
    GTEST_SKIP() << "tide writes Mistral's architecture as LLaMA's: the llama case is this one";
  if (GetParam() == "gemma3_multimodal")
    GTEST_SKIP() << "tide writes the language model alone, a Gemma3ForCausalLM: the gemma3_mixed case is this one";
  const ModelConfig config = tiny_model(GetParam());
  torch::manual_seed(3);
  Transformer model(config);
  model->reset_parameters(1);
  {
    // Biases start at zero and norm weights at a scale of one, where one the export lost or
    // misnamed would not show.
    torch::NoGradGuard no_grad;
    const auto ends_with = [](const std::string& s, const std::string& tail) {
      return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (auto& p : model->named_parameters()) {
      if (ends_with(p.key(), ".bias")) p.value().normal_(0, 0.2);
      if (ends_with(p.key(), "norm.weight")) p.value().normal_(config.norm_zero_centered ? 0 : 1, 0.2);
    }
  }
  model->eval();
  const fs::path dir = fs::temp_directory_path() / ("tide_hf_export_" + GetParam() + std::to_string(::getpid()));
  fs::remove_all(dir);
  export_hf(dir.string(), model);
  const auto ids = torch::randint(0, config.vocab_size, {2, 16}, torch::kInt64);
  const fs::path out = dir / "reference.safetensors";
  SafetensorsWriter writer;
  writer.add("input_ids", "I64", {ids.size(0), ids.size(1)}, ids.data_ptr(), static_cast<size_t>(ids.nbytes()));
  writer.write(out.string());
  run_hf_reference("logits " + dir.string() + " " + out.string());
  SafetensorsReader ref(out.string());
  const auto expected = read_named(ref, "logits");
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(ids);
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_LE((logits - expected).abs().max().item<double>(), logit_tolerance(config, ids.size(1), expected));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfReference,
                         ::testing::Values("llama", "bloom", "llama3", "llama_linear", "llama_yarn", "mistral", "qwen2",
                                           "mistral_window", "qwen2_window", "mistral_wide_heads", "qwen3", "gemma",
                                           "gemma2", "gemma3", "gemma3_window", "gemma3_mixed", "gemma3_multimodal",
                                           "qwen2_mixed", "mixtral", "qwen3_moe", "qwen2_moe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tide
