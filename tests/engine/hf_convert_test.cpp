#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/data/tokenizer.h"
#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/hf_convert.h"
#include "tide/engine/model/weights_io.h"
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/tensor_memory.h"
#include "tiny_models.h"

namespace tide {
namespace {
namespace fs = std::filesystem;
using testing::tiny_bloom;
using testing::tiny_llama;

fs::path temp_dir(const std::string& name) {
  const auto d = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

void expect_identical(Transformer& a, Transformer& b) {
  auto pb = b->named_parameters();
  ASSERT_EQ(a->named_parameters().size(), pb.size());
  for (const auto& item : a->named_parameters()) {
    ASSERT_NE(pb.find(item.key()), nullptr) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  }
  EXPECT_EQ(config_to_json(RunConfig{}), config_to_json(RunConfig{}));
}

class HfRoundTrip : public ::testing::TestWithParam<ModelConfig> {};

TEST_P(HfRoundTrip, ExportThenImportIsBitIdentical) {
  Transformer m(GetParam());
  m->reset_parameters(11);
  const auto dir = temp_dir("tide_hf");
  export_hf(dir.string(), m);
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  Transformer back = import_hf(dir.string());
  expect_identical(m, back);
  const auto tokens = torch::randint(0, GetParam().vocab_size, {1, 8}, torch::kInt64);
  EXPECT_TRUE(torch::equal(m->forward(tokens), back->forward(tokens)));
  fs::remove_all(dir);
}

TEST_P(HfRoundTrip, ShardedExportWritesAnIndex) {
  Transformer m(GetParam());
  m->reset_parameters(12);
  const auto dir = temp_dir("tide_hf_sharded");
  export_hf(dir.string(), m, /*max_shard_bytes=*/8 * 1024);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_GT(hf_weight_files(dir.string()).size(), 1u);
  Transformer back = import_hf(dir.string());
  expect_identical(m, back);
  fs::remove_all(dir);
}

TEST_P(HfRoundTrip, ImportWithoutTideFieldsUsesHfConfig) {
  Transformer m(GetParam());
  m->reset_parameters(13);
  const auto dir = temp_dir("tide_hf_plain");
  export_hf(dir.string(), m);
  nlohmann::json cfg;
  std::ifstream(dir / "config.json") >> cfg;
  cfg.erase("tide");  // as a config.json from the Hub looks
  std::ofstream(dir / "config.json", std::ios::trunc) << cfg.dump();
  Transformer back = import_hf(dir.string());
  EXPECT_EQ(parameter_count(back->config()), parameter_count(GetParam()));
  const ModelConfig &ours = GetParam(), &theirs = back->config();
  EXPECT_EQ(theirs.rope_scaling, ours.rope_scaling);
  EXPECT_EQ(theirs.sliding_window, ours.sliding_window);
  EXPECT_EQ(theirs.full_attention_layers, ours.full_attention_layers);
  EXPECT_EQ(theirs.rope_local_theta, ours.rope_local_theta);
  EXPECT_EQ(theirs.attention_softcap, ours.attention_softcap);
  EXPECT_EQ(theirs.final_logit_softcap, ours.final_logit_softcap);
  EXPECT_EQ(theirs.qkv_bias, ours.qkv_bias);
  EXPECT_EQ(theirs.mlp, ours.mlp);
  EXPECT_EQ(theirs.norm_zero_centered, ours.norm_zero_centered);
  EXPECT_EQ(theirs.embedding_scale, ours.embedding_scale);
  EXPECT_EQ(theirs.post_norms, ours.post_norms);
  EXPECT_NEAR(theirs.softmax_scale, ours.softmax_scale, 1e-15);
  if (ours.rope_scaling != RopeScaling::None) {
    EXPECT_EQ(theirs.rope_scaling_factor, ours.rope_scaling_factor);
    EXPECT_EQ(theirs.rope_original_max_seq_len, ours.rope_original_max_seq_len);
  }
  if (ours.rope_scaling == RopeScaling::Llama3) {
    EXPECT_EQ(theirs.rope_low_freq_factor, ours.rope_low_freq_factor);
    EXPECT_EQ(theirs.rope_high_freq_factor, ours.rope_high_freq_factor);
  }
  if (ours.rope_scaling == RopeScaling::Yarn) {
    EXPECT_EQ(theirs.rope_beta_fast, ours.rope_beta_fast);
    EXPECT_EQ(theirs.rope_beta_slow, ours.rope_beta_slow);
    EXPECT_EQ(theirs.rope_attention_factor, ours.rope_attention_factor);
  }
  expect_identical(m, back);
  fs::remove_all(dir);
}

ModelConfig tiny_llama_with_rope_scaling(RopeScaling kind) {
  ModelConfig m = tiny_llama();
  m.rope_scaling = kind;
  m.rope_scaling_factor = 32;
  m.rope_high_freq_factor = 3;
  m.rope_original_max_seq_len = 24;
  m.rope_beta_fast = 16;
  m.rope_beta_slow = 0.5;
  m.rope_attention_factor = kind == RopeScaling::Yarn ? 1.25 : 0;
  return m;
}

// Mistral's shape (a window) and Qwen2's (a window and biases on q, k and v).
ModelConfig tiny_llama_with_window(bool qkv_bias) {
  ModelConfig m = tiny_llama();
  m.sliding_window = 8;
  m.qkv_bias = qkv_bias;
  return m;
}

// Layers of both kinds: Qwen2's first layer in full; Gemma 3's second in full, its first
// over the window with a RoPE base of its own while the full one's frequencies are scaled.
ModelConfig tiny_qwen2_mixed() {
  ModelConfig m = tiny_llama_with_window(true);
  m.full_attention_layers = {0};
  return m;
}
ModelConfig tiny_gemma3_mixed() {
  ModelConfig m = testing::tiny_gemma3();
  m.sliding_window = 8;
  m.full_attention_layers = {1};
  m.rope_local_theta = 1000;
  m.rope_scaling = RopeScaling::Linear;
  m.rope_scaling_factor = 4;
  return m;
}

// Gemma 2: post-norms without query/key norms, soft-capped scores and logits, alternating
// layers.
ModelConfig tiny_gemma2() {
  ModelConfig m = testing::tiny_gemma();
  m.post_norms = true;
  m.softmax_scale = 0.20412414523193154;  // 1 / sqrt(24), not the heads' width of 16
  m.sliding_window = 8;
  m.full_attention_layers = {1};
  m.attention_softcap = 20;
  m.final_logit_softcap = 10;
  return m;
}

INSTANTIATE_TEST_SUITE_P(Convert, HfRoundTrip,
                         ::testing::Values(tiny_llama(), tiny_bloom(),
                                           tiny_llama_with_rope_scaling(RopeScaling::Llama3),
                                           tiny_llama_with_rope_scaling(RopeScaling::Yarn),
                                           tiny_llama_with_window(false), tiny_llama_with_window(true),
                                           testing::tiny_gemma(), testing::tiny_gemma3(), tiny_qwen2_mixed(),
                                           tiny_gemma3_mixed(), tiny_gemma2()),
                         [](const auto& info) {
                           const ModelConfig& m = info.param;
                           const std::string mixed = m.full_attention_layers.empty() ? "" : "_mixed";
                           if (m.post_norms) return (m.qk_norm ? "gemma3" : "gemma2") + mixed;
                           if (!mixed.empty()) return "qwen2" + mixed;
                           if (m.mlp == MlpKind::GeGLU) return std::string("gemma");
                           if (m.rope_scaling == RopeScaling::Yarn) return std::string("llama_yarn");
                           if (m.rope_scaling != RopeScaling::None) return std::string("llama_rope_scaling");
                           if (m.sliding_window > 0) return std::string(m.qkv_bias ? "qwen2_window" : "mistral_window");
                           return std::string(m.family == Family::LLaMA ? "llama" : "bloom");
                         });

TEST(HfConvert, BloomFilesWithoutTheTransformerPrefixLoad) {
  Transformer m(tiny_bloom());
  m->reset_parameters(14);
  const auto dir = temp_dir("tide_hf_bloom_prefix");
  fs::create_directories(dir);
  export_hf(dir.string(), m);
  // Rewrite the weights as BloomModel.save_pretrained names them: no "transformer.".
  const SafetensorsReader r((dir / "model.safetensors").string());
  std::vector<torch::Tensor> keep;
  SafetensorsWriter w;
  for (const auto& e : r.entries()) {
    keep.push_back(read_tensor(r, e));
    w.add(e.name.substr(std::string("transformer.").size()), e.dtype, e.shape, keep.back().data_ptr(),
          keep.back().nbytes());
  }
  w.write((dir / "model.safetensors").string());
  Transformer back = import_hf(dir.string());
  expect_identical(m, back);
  fs::remove_all(dir);
}

TEST(HfConvert, RefusesWhatTheArchitectureCannotExpress) {
  ModelConfig c = tiny_llama();
  c.norm = NormKind::LayerNorm;
  EXPECT_THROW(hf_config(c), ConfigError);
}

TEST(HfConvert, MissingOrMisshapenTensorsAreNamed) {
  Transformer m(tiny_llama());
  const auto dir = temp_dir("tide_weights");
  fs::create_directories(dir);
  save_model((dir / "model.safetensors").string(), m);
  ModelConfig other = tiny_llama();
  other.dim = 48;
  other.n_heads = 4;
  Transformer wrong(other);
  try {
    load_weights({(dir / "model.safetensors").string()}, *wrong);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  // A weights file written by tide carries its model config: load_model needs nothing else.
  LoadedModel loaded = load_model((dir / "model.safetensors").string());
  expect_identical(m, loaded.model);
  // Integer tensors are no weights: cast to float they would load as numbers like 1e9.
  const auto ints = torch::ones({other.dim}, torch::kInt32);
  SafetensorsWriter w;
  w.add("model.norm.weight", "I32", {other.dim}, ints.data_ptr(), static_cast<size_t>(ints.nbytes()));
  w.write((dir / "ints.safetensors").string());
  try {
    load_weights({(dir / "ints.safetensors").string()}, *wrong);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.norm.weight' is I32; weights must be"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Converting holds one parameter at a time, never the model: each tensor is read (its
// file's dtype, then fp32: 4 bytes an element, 6 at the moment a bf16 one is widened) and
// written in the output's dtype (2 bytes for bf16; fp32 is written as read) before the
// next, and the model's shapes are built with no memory. So the most host tensor memory
// held, exporting an fp32 file as bf16 or importing bf16 shards as fp32, is 6 bytes times
// the largest parameter's elements, exactly. Loading the model whole held 4 bytes times
// all of them. Weights that are not the model of their config are refused before anything
// is written.
TEST(HfConvert, ConversionHoldsOneParameterAtATime) {
  ModelConfig cfg = tiny_llama();
  cfg.n_layers = 6;
  Transformer m(cfg);
  m->reset_parameters(5);
  int64_t largest = 0, all = 0;
  for (const auto& p : m->parameters()) {
    largest = std::max(largest, p.numel());
    all += p.numel();
  }
  ASSERT_LT(6 * largest, 4 * all / 2) << "the model must be many times its largest parameter";
  const auto dir = temp_dir("tide_streamed");
  fs::create_directories(dir);
  save_model((dir / "model.safetensors").string(), m);
  count_host_tensor_memory();
  auto peak_of = [](const std::function<void()>& convert) {
    reset_peak_host_tensor_bytes();
    const int64_t before = host_tensor_bytes();
    convert();
    EXPECT_EQ(host_tensor_bytes(), before) << "a conversion keeps no tensor";
    return peak_host_tensor_bytes() - before;
  };
  EXPECT_EQ(peak_of([&] {
              convert_weights((dir / "model.safetensors").string(), (dir / "hf").string(), true,
                              /*max_shard_bytes=*/int64_t{16} * 1024, "BF16");
            }),
            6 * largest);
  EXPECT_GT(hf_weight_files((dir / "hf").string()).size(), 1u);
  EXPECT_EQ(peak_of([&] { convert_weights((dir / "hf").string(), (dir / "back").string(), false); }), 6 * largest);
  LoadedModel back = load_model((dir / "back").string());
  for (const auto& item : m->named_parameters())
    EXPECT_TRUE(
        torch::equal(item.value().to(torch::kBFloat16).to(torch::kFloat32), back.model->named_parameters()[item.key()]))
        << item.key();
  // A file of another model's weights is refused naming the tensor, and nothing is written.
  ModelConfig wider = cfg;
  wider.n_layers = 7;
  Transformer more(wider);
  const auto extra = dir / "extra";
  fs::create_directories(extra);
  save_weights((extra / "model.safetensors").string(), *more, weights_metadata(cfg));
  try {
    convert_weights((extra / "model.safetensors").string(), (dir / "refused").string(), true);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.6."), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "refused"));
  fs::remove_all(dir);
}

std::string hf_error(const nlohmann::json& config) {
  try {
    model_config_from_hf(config);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The field an export refuses the model for, "" when it has a Hugging Face architecture.
std::string export_refusal(const ModelConfig& m) {
  try {
    hf_config(m);
  } catch (const ConfigError& e) {
    return e.field();
  }
  return "";
}

// The same for `m` as `change` leaves it.
std::string export_refusal(ModelConfig m, const std::function<void(ModelConfig&)>& change) {
  change(m);
  return export_refusal(m);
}

TEST(HfConvert, ConfigValuesOfTheWrongTypeAreNamed) {
  nlohmann::json cfg = hf_config(tiny_llama());
  cfg.erase("tide");
  EXPECT_EQ(hf_error(cfg), "");
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json c = cfg;
    c[key] = v;
    return hf_error(c);
  };
  EXPECT_EQ(with("vocab_size", "257"), "config.json vocab_size: \"257\" is not an integer");
  EXPECT_EQ(with("rms_norm_eps", "small"), "config.json rms_norm_eps: \"small\" is not a number");
  EXPECT_EQ(with("tie_word_embeddings", 1), "config.json tie_word_embeddings: 1 is not true or false");
  EXPECT_EQ(with("model_type", 7), "config.json model_type: 7 is not a string");
  EXPECT_EQ(with("hidden_size", 64.5), "config.json hidden_size: 64.5 is not an integer");
  nlohmann::json missing = cfg;
  missing.erase("num_hidden_layers");
  EXPECT_EQ(hf_error(missing), "config.json num_hidden_layers: missing");
  EXPECT_EQ(hf_error(nlohmann::json::array()), "config.json: is array, not an object");
  // Values of the right type are held to the recipe schema's ranges and rules.
  EXPECT_EQ(with("num_attention_heads", 0), "config.json: gives model.n_heads: 0 is out of range [1, 100000]");
  EXPECT_EQ(with("head_dim", 7.5), "config.json head_dim: 7.5 is not an integer");
  EXPECT_EQ(with("head_dim", -8), "config.json: gives model.head_dim: -8 is out of range [0, 100000]");
  EXPECT_EQ(with("head_dim", 15),
            "config.json: gives model.positions: RoPE needs an even head dimension, "
            "model.head_dim = 15");
  // A width of its own is kept; hidden_size / num_attention_heads is the derived one.
  nlohmann::json wide = cfg;
  wide["head_dim"] = 16;
  EXPECT_EQ(model_config_from_hf(wide).head_dim, 16);
  EXPECT_EQ(hf_config(model_config_from_hf(wide))["head_dim"], 16);
  wide["head_dim"] = 8;
  EXPECT_EQ(model_config_from_hf(wide).head_dim, 0);
}

TEST(HfConvert, MistralAndQwen2ReadAsLlamaWithTheirWindowsOrAreRefusedByName) {
  nlohmann::json cfg = hf_config(tiny_llama());
  cfg.erase("tide");
  auto as = [&](const char* type, const nlohmann::json& extra) {
    nlohmann::json c = cfg;
    c["model_type"] = type;
    c.erase("attention_bias");
    c.erase("mlp_bias");
    c.update(extra);
    return c;
  };
  const ModelConfig qwen2 = model_config_from_hf(as("qwen2", {{"use_sliding_window", false}, {"sliding_window", 16}}));
  EXPECT_EQ(qwen2.family, Family::LLaMA);
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.attention_bias);
  EXPECT_EQ(qwen2.sliding_window, 0);
  EXPECT_EQ(hf_config(qwen2)["model_type"], "qwen2");
  EXPECT_EQ(hf_config(qwen2)["use_sliding_window"], false);
  // Qwen2's window is in the layers from max_window_layers on (28 when unsaid), or where
  // layer_types says so; the others attend in full.
  const auto qwen2_window = [&](const nlohmann::json& extra) {
    nlohmann::json c = as("qwen2", {{"use_sliding_window", true}, {"sliding_window", 16}});
    c.update(extra);
    return c;
  };
  EXPECT_EQ(model_config_from_hf(qwen2_window({{"max_window_layers", 0}})).sliding_window, 16);
  EXPECT_EQ(model_config_from_hf(qwen2_window(nlohmann::json::object())).sliding_window, 0);  // 28 >= 2 layers
  EXPECT_EQ(
      model_config_from_hf(qwen2_window({{"layer_types", {"sliding_attention", "sliding_attention"}}})).sliding_window,
      16);
  const ModelConfig qwen2_mixed = model_config_from_hf(qwen2_window({{"max_window_layers", 1}}));
  EXPECT_EQ(qwen2_mixed.sliding_window, 16);
  EXPECT_EQ(qwen2_mixed.full_attention_layers, std::vector<int64_t>{0});
  EXPECT_EQ(hf_config(qwen2_mixed)["max_window_layers"], 1);
  EXPECT_EQ(hf_config(qwen2_mixed)["layer_types"], nlohmann::json({"full_attention", "sliding_attention"}));
  EXPECT_EQ(model_config_from_hf(qwen2_window({{"layer_types", {"sliding_attention", "full_attention"}}}))
                .full_attention_layers,
            std::vector<int64_t>{1});
  // ... which Qwen's max_window_layers cannot say: its full layers come first.
  EXPECT_EQ(export_refusal(qwen2_mixed, [](ModelConfig& m) { m.full_attention_layers = {1}; }),
            "model.full_attention_layers");
  EXPECT_EQ(hf_error(qwen2_window({{"layer_types", {"full_attention", "chunked_attention"}}})),
            "config.json layer_types[1]: \"chunked_attention\" is neither full_attention nor sliding_attention");
  EXPECT_EQ(hf_error(qwen2_window({{"layer_types", {"full_attention"}}})),
            "config.json layer_types: [\"full_attention\"] is not a list of 2 layer types");
  const nlohmann::json qwen2_out = hf_config(model_config_from_hf(qwen2_window({{"max_window_layers", 0}})));
  EXPECT_EQ(qwen2_out["use_sliding_window"], true);
  EXPECT_EQ(qwen2_out["sliding_window"], 16);
  EXPECT_EQ(qwen2_out["max_window_layers"], 0);

  EXPECT_FALSE(model_config_from_hf(as("mistral", {{"sliding_window", nullptr}})).qkv_bias);
  // As long as max_position_embeddings: no token ever falls out of it.
  EXPECT_EQ(model_config_from_hf(as("mistral", {{"sliding_window", 32}})).sliding_window, 0);
  const ModelConfig mistral = model_config_from_hf(as("mistral", {{"sliding_window", 16}}));
  EXPECT_EQ(mistral.sliding_window, 16);
  EXPECT_EQ(hf_config(mistral)["model_type"], "mistral");
  EXPECT_EQ(hf_config(mistral)["architectures"], nlohmann::json({"MistralForCausalLM"}));
  EXPECT_EQ(hf_config(mistral)["sliding_window"], 16);
  EXPECT_EQ(hf_error(as("mistral", {{"sliding_window", -1}})),
            "config.json: gives model.sliding_window: -1 is out of range [0, 1000000000]");
  ModelConfig biased = mistral;
  biased.mlp_bias = true;
  EXPECT_EQ(export_refusal(biased), "model.sliding_window");  // a windowed model with MLP biases
  // Qwen3: query/key norms, biases on all four attention projections or none.
  const ModelConfig qwen3 = model_config_from_hf(as("qwen3", {{"head_dim", 16}, {"attention_bias", false}}));
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_FALSE(qwen3.qkv_bias);
  EXPECT_EQ(qwen3.head_dim, 16);
  EXPECT_EQ(hf_config(qwen3)["model_type"], "qwen3");
  EXPECT_EQ(hf_config(qwen3)["architectures"], nlohmann::json({"Qwen3ForCausalLM"}));
  EXPECT_TRUE(model_config_from_hf(as("qwen3", {{"attention_bias", true}})).attention_bias);
  ModelConfig qwen3_qkv = qwen3;
  qwen3_qkv.qkv_bias = true;
  EXPECT_EQ(export_refusal(qwen3_qkv), "model.qk_norm");  // query/key norms, biases on q, k and v alone
  EXPECT_EQ(hf_error(as("llama", {{"hidden_act", "gelu"}})),
            "config.json hidden_act: 'gelu' is not silu, the SwiGLU MLP's");
  EXPECT_EQ(hf_error(as("falcon", nlohmann::json::object())),
            "config.json model_type: 'falcon' is not a supported family (llama, mistral, mixtral, qwen2, qwen2_moe, "
            "qwen3, qwen3_moe, gemma, gemma2, gemma3_text, bloom)");
}

TEST(HfConvert, MixturesOfExpertsReadAsMixtralAndQwen3MoeOrAreRefusedByName) {
  nlohmann::json cfg = hf_config(tiny_llama());
  cfg.erase("tide");
  const auto as = [&](const std::string& type, const nlohmann::json& extra) {
    nlohmann::json c = cfg;
    c["model_type"] = type;
    for (const auto& [k, v] : extra.items()) c[k] = v;
    return c;
  };
  const ModelConfig mixtral = model_config_from_hf(as("mixtral", {{"num_local_experts", 8}}));
  EXPECT_EQ(mixtral.moe_experts, 8);
  EXPECT_EQ(mixtral.moe_top_k, 2);  // transformers' default num_experts_per_tok
  EXPECT_TRUE(mixtral.moe_normalize_top_k);
  EXPECT_EQ(hf_config(mixtral)["architectures"], nlohmann::json({"MixtralForCausalLM"}));
  EXPECT_EQ(hf_config(mixtral)["num_local_experts"], 8);
  EXPECT_EQ(hf_export_name(mixtral, "model.layers.3.mlp.experts.5.up_proj.weight"),
            "model.layers.3.block_sparse_moe.experts.5.w3.weight");
  EXPECT_EQ(hf_export_name(mixtral, "model.layers.3.mlp.gate.weight"), "model.layers.3.block_sparse_moe.gate.weight");
  EXPECT_EQ(hf_parameter_name(mixtral, as("mixtral", {}))("model.layers.0.block_sparse_moe.experts.12.w2.weight"),
            "model.layers.0.mlp.experts.12.down_proj.weight");
  const ModelConfig qwen = model_config_from_hf(
      as("qwen3_moe", {{"num_experts", 16}, {"num_experts_per_tok", 4}, {"moe_intermediate_size", 40}}));
  EXPECT_EQ(qwen.moe_experts, 16);
  EXPECT_EQ(qwen.moe_top_k, 4);
  EXPECT_EQ(resolved_ffn_dim(qwen), 40);
  EXPECT_FALSE(qwen.moe_normalize_top_k);  // Qwen3MoeConfig's default norm_topk_prob
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_EQ(hf_config(qwen)["model_type"], "qwen3_moe");
  EXPECT_EQ(hf_export_name(qwen, "model.layers.3.mlp.gate.weight"), "model.layers.3.mlp.gate.weight");
  EXPECT_EQ(hf_error(as("qwen3_moe", {{"moe_intermediate_size", 40}, {"mlp_only_layers", {1}}})),
            "config.json mlp_only_layers: [1]: dense layers among the experts' are not supported");
  EXPECT_EQ(hf_error(as("qwen3_moe", {{"moe_intermediate_size", 40}, {"decoder_sparse_step", 2}})),
            "config.json decoder_sparse_step: 2: only every layer a mixture of experts (1) is supported");
  ModelConfig unnormalised = mixtral;
  unnormalised.moe_normalize_top_k = false;  // without query/key norms, only Mixtral's form exports
  EXPECT_EQ(export_refusal(unnormalised), "model.moe_experts");

  // Qwen2-MoE: a gated shared expert beside the routed ones, biases on q, k and v; named as
  // tide names them.
  const ModelConfig qwen2 = model_config_from_hf(
      as("qwen2_moe", {{"num_experts", 8}, {"moe_intermediate_size", 40}, {"shared_expert_intermediate_size", 80}}));
  EXPECT_EQ(qwen2.moe_experts, 8);
  EXPECT_EQ(qwen2.moe_shared_ffn_dim, 80);
  EXPECT_TRUE(qwen2.moe_shared_gate);
  EXPECT_TRUE(qwen2.qkv_bias);  // Qwen2MoeConfig's default qkv_bias
  EXPECT_FALSE(qwen2.qk_norm);
  EXPECT_EQ(hf_config(qwen2)["architectures"], nlohmann::json({"Qwen2MoeForCausalLM"}));
  EXPECT_EQ(hf_config(qwen2)["shared_expert_intermediate_size"], 80);
  EXPECT_EQ(hf_export_name(qwen2, "model.layers.3.mlp.shared_expert_gate.weight"),
            "model.layers.3.mlp.shared_expert_gate.weight");
  EXPECT_EQ(hf_export_name(qwen2, "model.layers.3.mlp.experts.5.up_proj.weight"),
            "model.layers.3.mlp.experts.5.up_proj.weight");
  ModelConfig ungated = qwen2;
  ungated.moe_shared_gate = false;  // DeepSeek's form: no Hugging Face architecture tide writes
  EXPECT_EQ(export_refusal(ungated), "model.moe_shared_ffn_dim");
  // DeepSeek-V3's routing exports nowhere: the families tide writes route by a softmax,
  // unbiased and unscaled.
  EXPECT_EQ(export_refusal(mixtral, [](ModelConfig& m) { m.moe_router = MoeRouterScore::Sigmoid; }),
            "model.moe_router");
  EXPECT_EQ(export_refusal(qwen, [](ModelConfig& m) { m.moe_expert_bias = true; }), "model.moe_expert_bias");
  EXPECT_EQ(export_refusal(qwen2, [](ModelConfig& m) { m.moe_routed_scale = 2.5; }), "model.moe_routed_scale");
}

TEST(HfConvert, RoutingBiasesTravelWithTheWeights) {
  // A tide weights file carries the experts' routing biases (buffers, not parameters):
  // load_model routes as the model that saved it did.
  ModelConfig cfg = testing::tiny_moe();
  cfg.moe_expert_bias = true;
  Transformer m(cfg);
  m->reset_parameters(2);
  {
    torch::NoGradGuard no_grad;
    m->blocks->ptr<BlockImpl>(1)->moe->expert_bias.copy_(torch::tensor({0.25F, -0.5F, 0.0F, 0.125F}));
  }
  const auto dir = temp_dir("tide_bias");
  fs::create_directories(dir);
  save_model((dir / "model.safetensors").string(), m);
  LoadedModel loaded = load_model((dir / "model.safetensors").string());
  EXPECT_TRUE(torch::equal(loaded.model->blocks->ptr<BlockImpl>(1)->moe->expert_bias,
                           torch::tensor({0.25F, -0.5F, 0.0F, 0.125F})));
  expect_identical(m, loaded.model);
  // Files of a model without them (a Mixtral import) do not fit one with them.
  ModelConfig plain = cfg;
  plain.moe_expert_bias = false;
  Transformer without(plain);
  try {
    load_weights({(dir / "model.safetensors").string()}, *without);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.0.mlp.expert_bias' has no parameter"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(HfConvert, GemmaReadsAsGeGluZeroCentredNormsAndScaledEmbeddingsOrIsRefusedByName) {
  nlohmann::json cfg = hf_config(tiny_llama());
  cfg.erase("tide");
  cfg.erase("tie_word_embeddings");
  cfg.erase("head_dim");
  cfg["model_type"] = "gemma";
  cfg["hidden_act"] = "gelu";  // Gemma 1's older key, beside hidden_activation
  cfg["hidden_activation"] = "gelu_pytorch_tanh";
  const ModelConfig gemma = model_config_from_hf(cfg);
  EXPECT_EQ(gemma.mlp, MlpKind::GeGLU);
  EXPECT_TRUE(gemma.norm_zero_centered);
  EXPECT_EQ(gemma.embedding_scale, std::sqrt(32.0));
  EXPECT_TRUE(gemma.tie_embeddings);  // Gemma's default
  EXPECT_EQ(gemma.head_dim, 256);     // transformers' default, Gemma 7B's
  const nlohmann::json out = hf_config(gemma);
  EXPECT_EQ(out["model_type"], "gemma");
  EXPECT_EQ(out["architectures"], nlohmann::json({"GemmaForCausalLM"}));
  EXPECT_EQ(out["hidden_act"], "gelu_pytorch_tanh");
  EXPECT_EQ(out["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(out["head_dim"], 256);
  EXPECT_FALSE(out.contains("mlp_bias"));
  // Only hidden_act, as Gemma 1's first files: "gelu" there is the tanh form too.
  nlohmann::json legacy = cfg;
  legacy.erase("hidden_activation");
  EXPECT_EQ(model_config_from_hf(legacy).mlp, MlpKind::GeGLU);
  nlohmann::json relu = cfg;
  relu["hidden_activation"] = "relu";
  EXPECT_EQ(hf_error(relu),
            "config.json hidden_activation: 'relu' is not gelu_pytorch_tanh, the tanh form of gelu Gemma's MLP is "
            "gated by");
  // What Gemma's config cannot say, refused by the field that says it.
  EXPECT_EQ(export_refusal(gemma, [](ModelConfig& m) { m.embedding_scale = 1; }), "model.embedding_scale");
  EXPECT_EQ(export_refusal(gemma, [](ModelConfig& m) { m.norm_zero_centered = false; }), "model.norm_zero_centered");
  EXPECT_EQ(export_refusal(gemma, [](ModelConfig& m) { m.sliding_window = 8; }), "model.mlp");
  EXPECT_EQ(export_refusal(tiny_llama(), [](ModelConfig& m) { m.norm_zero_centered = true; }),
            "model.norm_zero_centered");
  EXPECT_EQ(export_refusal(tiny_llama(), [](ModelConfig& m) { m.embedding_scale = 2; }), "model.embedding_scale");
  EXPECT_EQ(export_refusal(tiny_bloom(), [](ModelConfig& m) { m.norm_zero_centered = true; }),
            "model.norm_zero_centered");
  // Query/key norms are Gemma 3's, which has post-norms.
  EXPECT_EQ(export_refusal(gemma, [](ModelConfig& m) { m.qk_norm = true; }), "model.mlp");
}

// A config.json of Gemma 2's or 3's from the tiny LLaMA's shape, as the Hub's look: heads
// of 16, scores scaled by 24^-1/2, a window of 8, tied by default.
nlohmann::json gemma_like_config(const char* model_type) {
  nlohmann::json cfg = hf_config(tiny_llama());
  cfg.erase("tide");
  cfg.erase("tie_word_embeddings");
  cfg["model_type"] = model_type;
  cfg["head_dim"] = 16;
  cfg["hidden_activation"] = "gelu_pytorch_tanh";
  cfg["query_pre_attn_scalar"] = 24;
  cfg["sliding_window"] = 8;
  return cfg;
}

TEST(HfConvert, Gemma2ReadsWithPostNormsSoftCapsAndAlternatingLayers) {
  const nlohmann::json cfg = gemma_like_config("gemma2");
  const auto with = [&](const nlohmann::json& extra) {
    nlohmann::json c = cfg;
    c.update(extra);
    return c;
  };
  // Gemma2Config's defaults: caps of 50 and 30, the even layers over the window.
  const ModelConfig g = model_config_from_hf(cfg);
  EXPECT_TRUE(g.post_norms);
  EXPECT_FALSE(g.qk_norm);
  EXPECT_TRUE(g.norm_zero_centered);
  EXPECT_TRUE(g.tie_embeddings);
  EXPECT_EQ(g.mlp, MlpKind::GeGLU);
  EXPECT_EQ(g.softmax_scale, 1 / std::sqrt(24.0));
  EXPECT_EQ(g.attention_softcap, 50);
  EXPECT_EQ(g.final_logit_softcap, 30);
  EXPECT_EQ(g.sliding_window, 8);
  EXPECT_EQ(g.full_attention_layers, std::vector<int64_t>{1});
  EXPECT_EQ(g.rope_local_theta, 0);
  // null: no cap; layer_types as given.
  const ModelConfig uncapped = model_config_from_hf(with({{"attn_logit_softcapping", nullptr},
                                                          {"final_logit_softcapping", 20.0},
                                                          {"layer_types", {"full_attention", "full_attention"}}}));
  EXPECT_EQ(uncapped.attention_softcap, 0);
  EXPECT_EQ(uncapped.final_logit_softcap, 20);
  EXPECT_EQ(uncapped.sliding_window, 0);
  EXPECT_EQ(hf_error(with({{"attn_logit_softcapping", 0}})),
            "config.json attn_logit_softcapping: 0 is not a positive cap");
  // Written back as read: caps, null where none (Gemma2Config would default them), each
  // layer's type.
  const nlohmann::json out = hf_config(g);
  EXPECT_EQ(out["model_type"], "gemma2");
  EXPECT_EQ(out["architectures"], nlohmann::json({"Gemma2ForCausalLM"}));
  EXPECT_EQ(out["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(out["final_logit_softcapping"], 30.0);
  EXPECT_EQ(out["layer_types"], nlohmann::json({"sliding_attention", "full_attention"}));
  EXPECT_TRUE(hf_config(uncapped)["attn_logit_softcapping"].is_null());
  EXPECT_EQ(model_config_from_hf(hf_config(uncapped)).attention_softcap, 0);
  // No family but Gemma 2 soft-caps; no Gemma 2 has a local RoPE base.
  EXPECT_EQ(export_refusal(tiny_llama(), [](ModelConfig& m) { m.attention_softcap = 50; }), "model.attention_softcap");
  EXPECT_EQ(export_refusal(tiny_llama(), [](ModelConfig& m) { m.final_logit_softcap = 30; }),
            "model.final_logit_softcap");
  EXPECT_EQ(export_refusal(g, [](ModelConfig& m) { m.rope_local_theta = 1000; }), "model.rope_local_theta");
}

TEST(HfConvert, Gemma3ReadsWithPostNormsItsScaleAndEachLayersAttention) {
  nlohmann::json cfg = gemma_like_config("gemma3_text");
  cfg["rope_theta"] = 1e6;
  cfg["rope_local_base_freq"] = 1e4;
  cfg["attn_logit_softcapping"] = cfg["final_logit_softcapping"] = nullptr;
  const auto with = [&](const nlohmann::json& extra) {
    nlohmann::json c = cfg;
    c.update(extra);
    return c;
  };
  const ModelConfig full = model_config_from_hf(with({{"layer_types", {"full_attention", "full_attention"}}}));
  EXPECT_TRUE(full.post_norms);
  EXPECT_TRUE(full.qk_norm);
  EXPECT_TRUE(full.norm_zero_centered);
  EXPECT_EQ(full.mlp, MlpKind::GeGLU);
  EXPECT_EQ(full.softmax_scale, 1 / std::sqrt(24.0));
  EXPECT_EQ(full.sliding_window, 0);
  EXPECT_EQ(full.rope_theta, 1e6);
  // Every layer over the window: the local RoPE base, without the full layers' scaling.
  const ModelConfig local = model_config_from_hf(with({{"layer_types", {"sliding_attention", "sliding_attention"}},
                                                       {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}}));
  EXPECT_EQ(local.sliding_window, 8);
  EXPECT_TRUE(local.full_attention_layers.empty());
  EXPECT_EQ(local.rope_local_theta, 1e4);
  EXPECT_EQ(local.rope_theta, 1e6);
  EXPECT_EQ(windowed_rope(local).rope_theta, 1e4);
  EXPECT_EQ(windowed_rope(local).rope_scaling, RopeScaling::None);
  // Without sliding_window the layers still take the local base (the window is
  // transformers' 4096, which the 32-token model fits in: no mask).
  nlohmann::json unsized = with({{"layer_types", {"sliding_attention", "sliding_attention"}}});
  unsized.erase("sliding_window");
  EXPECT_EQ(model_config_from_hf(unsized).rope_local_theta, 1e4);
  EXPECT_EQ(model_config_from_hf(unsized).sliding_window, 4096);
  // A local base equal to the global one, unscaled: one base for every layer.
  EXPECT_EQ(model_config_from_hf(
                with({{"layer_types", {"sliding_attention", "full_attention"}}, {"rope_local_base_freq", 1e6}}))
                .rope_local_theta,
            0);
  // query_pre_attn_scalar equal to the head's width is the default scale.
  EXPECT_EQ(
      model_config_from_hf(with({{"layer_types", {"full_attention", "full_attention"}}, {"query_pre_attn_scalar", 16}}))
          .softmax_scale,
      0);
  // Written back as read.
  const nlohmann::json out = hf_config(full);
  EXPECT_EQ(out["model_type"], "gemma3_text");
  EXPECT_EQ(out["architectures"], nlohmann::json({"Gemma3ForCausalLM"}));
  EXPECT_NEAR(out["query_pre_attn_scalar"].get<double>(), 24.0, 1e-12);
  EXPECT_EQ(out["layer_types"], nlohmann::json({"full_attention", "full_attention"}));
  EXPECT_EQ(hf_config(local)["layer_types"], nlohmann::json({"sliding_attention", "sliding_attention"}));
  EXPECT_EQ(hf_config(local)["rope_local_base_freq"], 1e4);
  // Gemma 3's own 5:1 pattern (sliding_window_pattern 6: here both layers local, the sixth
  // would be the first full one) and any mix; every layer's kind written back.
  EXPECT_TRUE(model_config_from_hf(cfg).full_attention_layers.empty());  // no layer_types
  EXPECT_EQ(model_config_from_hf(cfg).sliding_window, 8);
  const ModelConfig mixed = model_config_from_hf(with({{"sliding_window_pattern", 2}}));
  EXPECT_EQ(mixed.full_attention_layers, std::vector<int64_t>{1});
  EXPECT_EQ(mixed.rope_local_theta, 1e4);
  EXPECT_EQ(hf_config(mixed)["layer_types"], nlohmann::json({"sliding_attention", "full_attention"}));
  EXPECT_EQ(
      model_config_from_hf(with({{"layer_types", {"full_attention", "sliding_attention"}}})).full_attention_layers,
      std::vector<int64_t>{0});
  // Soft-capping and bidirectional attention: refused, named.
  EXPECT_EQ(hf_error(with({{"attn_logit_softcapping", 50.0}})),
            "config.json attn_logit_softcapping: 50.0: soft-capped logits are not supported");
  EXPECT_EQ(hf_error(with({{"use_bidirectional_attention", true}})),
            "config.json use_bidirectional_attention: true: tide's decoder attends causally");
  EXPECT_EQ(hf_error(with({{"query_pre_attn_scalar", 0}})),
            "config.json query_pre_attn_scalar: 0 is not a positive number");
  // Without query/key norms it is Gemma 2's architecture; Gemma 3 has no soft-caps.
  ModelConfig no_qk_norm = full;
  no_qk_norm.qk_norm = false;
  EXPECT_EQ(hf_config(no_qk_norm)["model_type"], "gemma2");
  EXPECT_EQ(export_refusal(full, [](ModelConfig& m) { m.attention_softcap = 50; }), "model.attention_softcap");
  EXPECT_EQ(export_refusal(full, [](ModelConfig& m) { m.final_logit_softcap = 30; }), "model.final_logit_softcap");
  // The window's layers of Gemma 3 rotate unscaled: with a scaling and no base of their own,
  // refused; the other families have no local base.
  EXPECT_EQ(export_refusal(mixed,
                           [](ModelConfig& m) {
                             m.rope_local_theta = 0;
                             m.rope_scaling = RopeScaling::Linear;
                           }),
            "model.rope_local_theta");
  EXPECT_EQ(export_refusal(tiny_llama(),
                           [](ModelConfig& m) {
                             m.sliding_window = 8;
                             m.rope_local_theta = 1e4;
                           }),
            "model.rope_local_theta");
  EXPECT_EQ(export_refusal(tiny_llama(),
                           [](ModelConfig& m) {
                             m.sliding_window = 8;
                             m.full_attention_layers = {0};
                           }),
            "model.full_attention_layers");
  EXPECT_EQ(export_refusal(tiny_llama(), [](ModelConfig& m) { m.post_norms = true; }), "model.post_norms");
  EXPECT_EQ(export_refusal(tiny_llama(), [](ModelConfig& m) { m.softmax_scale = 0.5; }), "model.softmax_scale");
}

// Gemma 3 4B as google/gemma-3-4b-pt's config.json gives it: a Gemma3ForConditionalGeneration
// whose text_config says only what differs from Gemma3TextConfig's defaults. Its language
// model is tide's model: 3,880,263,168 parameters, the published 4,300,079,472 less the
// SigLIP tower's 416,866,032 and the projector's 1152 x 2560 + 1152.
TEST(HfConvert, AMultimodalGemma3IsItsLanguageModel) {
  const nlohmann::json cfg = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                              {"model_type", "gemma3"},
                              {"mm_tokens_per_image", 256},
                              {"text_config",
                               {{"hidden_size", 2560},
                                {"intermediate_size", 10240},
                                {"model_type", "gemma3_text"},
                                {"num_hidden_layers", 34},
                                {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
                                {"sliding_window", 1024}}},
                              {"vision_config", {{"model_type", "siglip_vision_model"}, {"hidden_size", 1152}}}};
  const ModelConfig m = model_config_from_hf(cfg);
  EXPECT_EQ(parameter_count(m), 3'880'263'168);
  EXPECT_EQ(m.vocab_size, 262208);
  EXPECT_EQ(m.n_heads, 8);
  EXPECT_EQ(m.n_kv_heads, 4);
  EXPECT_EQ(head_dim(m), 256);
  EXPECT_EQ(m.max_seq_len, 131072);
  EXPECT_TRUE(m.tie_embeddings && m.post_norms && m.qk_norm);
  EXPECT_EQ(m.full_attention_layers, (std::vector<int64_t>{5, 11, 17, 23, 29}));
  EXPECT_EQ(m.sliding_window, 1024);
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.rope_scaling, RopeScaling::Linear);
  EXPECT_EQ(m.rope_scaling_factor, 8);
  EXPECT_EQ(m.rope_local_theta, 1e4);
  // Its tensors, as transformers saves them and as it names them in memory; the vision
  // tower's and the projector's are left out, the tied head too.
  const auto name = hf_parameter_name(m, cfg);
  EXPECT_EQ(name("language_model.model.layers.3.mlp.up_proj.weight"), "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(name("model.language_model.norm.weight"), "model.norm.weight");
  EXPECT_EQ(name("language_model.lm_head.weight"), "");
  EXPECT_EQ(name("vision_tower.vision_model.embeddings.patch_embedding.weight"), "");
  EXPECT_EQ(name("multi_modal_projector.mm_input_projection_weight"), "");
  EXPECT_EQ(name("model.vision_tower.vision_model.post_layernorm.bias"), "");
  // A text-only file's names are its own.
  EXPECT_EQ(hf_parameter_name(m, cfg["text_config"])("vision_tower.x"), "vision_tower.x");
  // Errors name the key where the file has it.
  nlohmann::json bad = cfg;
  bad["text_config"]["hidden_size"] = "wide";
  EXPECT_EQ(hf_error(bad), "config.json text_config.hidden_size: \"wide\" is not an integer");
  bad.erase("text_config");
  EXPECT_EQ(hf_error(bad), "config.json text_config: missing: a gemma3 file describes its language model there");
}

TEST(HfConvert, RopeScalingIsReadOrRefusedByName) {
  nlohmann::json cfg = hf_config(tiny_llama());
  cfg.erase("tide");
  auto scaled = [&](const nlohmann::json& scaling) {
    nlohmann::json c = cfg;
    c["rope_scaling"] = scaling;
    return c;
  };
  // Older files say `type`; Llama 3.1's config.json, `rope_type`.
  const ModelConfig linear = model_config_from_hf(scaled({{"type", "linear"}, {"factor", 2.0}}));
  EXPECT_EQ(linear.rope_scaling, RopeScaling::Linear);
  EXPECT_EQ(linear.rope_scaling_factor, 2.0);
  const ModelConfig llama3 = model_config_from_hf(scaled({{"rope_type", "llama3"},
                                                          {"factor", 8.0},
                                                          {"low_freq_factor", 1.0},
                                                          {"high_freq_factor", 4.0},
                                                          {"original_max_position_embeddings", 8192}}));
  EXPECT_EQ(llama3.rope_scaling, RopeScaling::Llama3);
  EXPECT_EQ(llama3.rope_original_max_seq_len, 8192);
  EXPECT_EQ(model_config_from_hf(scaled(nullptr)).rope_scaling, RopeScaling::None);  // "rope_scaling": null
  // Qwen2.5's yarn: the context before scaling defaults to max_position_embeddings (32
  // here), the betas to YaRN's 32 and 1, the attention factor to 0.1 ln(factor) + 1 (0).
  const ModelConfig yarn = model_config_from_hf(scaled({{"type", "yarn"}, {"factor", 4.0}}));
  EXPECT_EQ(yarn.rope_scaling, RopeScaling::Yarn);
  EXPECT_EQ(yarn.rope_original_max_seq_len, 32);
  EXPECT_EQ(yarn.rope_beta_fast, 32.0);
  EXPECT_EQ(yarn.rope_beta_slow, 1.0);
  EXPECT_EQ(yarn.rope_attention_factor, 0.0);
  EXPECT_NEAR(rope_attention_scale(yarn), 0.1 * std::log(4.0) + 1, 1e-15);
  EXPECT_EQ(model_config_from_hf(scaled({{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}}))
                .rope_attention_factor,
            1.5);
  // DeepSeek's mscale and mscale_all_dim: the ratio of YaRN's factor with each.
  EXPECT_NEAR(model_config_from_hf(
                  scaled({{"rope_type", "yarn"}, {"factor", 40.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.707}}))
                  .rope_attention_factor,
              (0.1 * std::log(40.0) + 1) / (0.0707 * std::log(40.0) + 1), 1e-12);
  EXPECT_EQ(hf_error(scaled({{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", false}})),
            "config.json rope_scaling.truncate: false: yarn scaling with an unrounded ramp is not supported");
  EXPECT_EQ(hf_error(scaled({{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1.0}, {"beta_slow", 2.0}})),
            "config.json: gives model.rope_beta_fast: 1 is not above model.rope_beta_slow = 2: yarn scaling ramps "
            "between them");
  nlohmann::json base_one = scaled({{"rope_type", "yarn"}, {"factor", 4.0}});
  base_one["rope_theta"] = 1.0;
  EXPECT_EQ(hf_error(base_one),
            "config.json: gives model.rope_theta: 1 leaves yarn scaling no dimensions to ramp "
            "between: it needs a base above 1");
  EXPECT_EQ(hf_error(scaled({{"rope_type", "dynamic"}, {"factor", 4.0}})),
            "config.json rope_scaling.rope_type: 'dynamic' is not a supported RoPE scaling (linear, llama3, yarn)");
  EXPECT_EQ(hf_error(scaled({{"rope_type", "llama3"}, {"factor", 8.0}})),
            "config.json rope_scaling.original_max_position_embeddings: missing");
  EXPECT_EQ(hf_error(scaled({{"rope_type", "linear"}})), "config.json rope_scaling.factor: missing");
  EXPECT_EQ(hf_error(scaled({{"rope_type", "linear"}, {"factor", "2"}})),
            "config.json rope_scaling.factor: \"2\" is not a number");
  EXPECT_EQ(hf_error(scaled({{"rope_type", "linear"}, {"factor", 0.5}})),
            "config.json: gives model.rope_scaling_factor: 0.5 is out of range [1, 1000000]");
  EXPECT_EQ(hf_error(scaled({{"factor", 2.0}})), "config.json rope_scaling.rope_type: missing");
  EXPECT_EQ(hf_error(scaled("linear")), "config.json rope_scaling: is string, not an object");
}

TEST(HfConvert, AnIndexNamingAFileOutsideTheDirectoryIsRefused) {
  Transformer m(tiny_llama());
  const auto dir = temp_dir("tide_hf_index");
  export_hf(dir.string(), m, /*max_shard_bytes=*/8 * 1024);
  nlohmann::json index;
  std::ifstream(dir / "model.safetensors.index.json") >> index;
  index["weight_map"]["model.norm.weight"] = "../../etc/passwd";
  std::ofstream(dir / "model.safetensors.index.json", std::ios::trunc) << index.dump();
  try {
    hf_weight_files(dir.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_map.model.norm.weight = \"../../etc/passwd\" is not a file name"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

nlohmann::json read_json_at(const fs::path& p) {
  nlohmann::json j;
  std::ifstream(p) >> j;
  return j;
}

TEST(HfConvert, ExportWithATokenizerNamesItsSpecialTokens) {
  Transformer m(tiny_llama());
  const auto dir = temp_dir("tide_hf_tokenizer");
  const auto src = temp_dir("tide_hf_tokenizer_src");
  fs::create_directories(src);
  const ByteLevelBpe bytes = ByteLevelBpe::bytes();  // <|endoftext|> is id 256
  bytes.save((src / "tokenizer.json").string());
  export_hf(dir.string(), m, 0, "BF16", (src / "tokenizer.json").string());
  const auto config = read_json_at(dir / "config.json");
  EXPECT_EQ(config["eos_token_id"], 256);
  EXPECT_EQ(config["bos_token_id"], 256);  // no begin-of-sequence token: GPT-2's convention
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  const auto tc = read_json_at(dir / "tokenizer_config.json");
  EXPECT_EQ(tc["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(tc["eos_token"], "<|endoftext|>");
  EXPECT_EQ(tc["bos_token"], "<|endoftext|>");
  EXPECT_EQ(tc["model_max_length"], tiny_llama().max_seq_len);
  EXPECT_EQ(read_json_at(dir / "generation_config.json")["eos_token_id"], 256);
  EXPECT_EQ(load_tokenizer((dir / "tokenizer.json").string())->vocab_size(), 257);
  fs::remove_all(dir);
  fs::remove_all(src);
}

}  // namespace
}  // namespace tide
