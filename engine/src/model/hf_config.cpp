#include "tide/engine/model/hf_config.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/io/file_name.h"
#include "tide/engine/io/json_input.h"

namespace tide {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
void require(bool ok, const std::string& field, const std::string& why) {
  if (!ok) throw ConfigError(field, why + " (not expressible in the Hugging Face architecture)");
}

// Hugging Face's name of each layer's attention.
std::vector<std::string> layer_types(const ModelConfig& m) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < m.n_layers; ++i)
    out.emplace_back(attends_over_window(m, i) ? "sliding_attention" : "full_attention");
  return out;
}
}  // namespace

json hf_config(const ModelConfig& m) {
  json j;
  if (m.family == Family::LLaMA) {
    require(m.norm == NormKind::RMSNorm, "model.norm", "LLaMA uses RMSNorm");
    require(m.positions == PositionKind::RoPE, "model.positions", "LLaMA uses RoPE");
    require(m.mlp != MlpKind::GELU, "model.mlp", "LLaMA uses SwiGLU");
    require(!m.embedding_norm, "model.embedding_norm", "LLaMA has no embedding norm");
    // A GeGLU MLP is Gemma's architecture, with its zero-centred norms and embeddings
    // scaled by sqrt(dim); every other LLaMA-like family has neither.
    // Gemma 2 adds post-norms, a scale of its own and soft-capped logits to Gemma's;
    // Gemma 3 post-norms, query/key norms and a scale, and no caps.
    const bool gemma = m.mlp == MlpKind::GeGLU;
    const bool gemma2 = gemma && m.post_norms && !m.qk_norm, gemma3 = gemma && m.post_norms && m.qk_norm;
    const double gemma_scale = std::sqrt(static_cast<double>(m.dim));
    if (gemma) {
      require(m.norm_zero_centered, "model.norm_zero_centered",
              "Gemma (a GeGLU MLP) multiplies by 1 + its norm weights");
      require(std::abs(m.embedding_scale - gemma_scale) <= 1e-6 * gemma_scale, "model.embedding_scale",
              fmt::format("Gemma (a GeGLU MLP) scales its embeddings by sqrt(model.dim) = {}, not {}", gemma_scale,
                          m.embedding_scale));
      require(!m.qkv_bias && !m.mlp_bias, "model.mlp",
              "Gemma (a GeGLU MLP) has no biases on q, k and v alone or on its MLP");
      if (gemma3) {
        require(m.attention_softcap == 0, "model.attention_softcap",
                "Gemma 3 (a GeGLU MLP with post-norms and query/key norms) does not soft-cap attention");
        require(m.final_logit_softcap == 0, "model.final_logit_softcap",
                "Gemma 3 (a GeGLU MLP with post-norms and query/key norms) does not soft-cap its logits");
        require(m.sliding_window == 0 || m.rope_local_theta > 0 || m.rope_scaling == RopeScaling::None,
                "model.rope_local_theta",
                "Gemma 3's sliding-window layers take no RoPE scaling: they need a base of their own");
      } else if (!gemma2) {
        require(!m.qk_norm && m.sliding_window == 0 && m.softmax_scale == 0 && m.attention_softcap == 0 &&
                    m.final_logit_softcap == 0,
                "model.mlp",
                "Gemma (a GeGLU MLP without post-norms) has no query/key norms, sliding window, scale of its own or "
                "soft-caps");
      }
    } else {
      require(!m.norm_zero_centered, "model.norm_zero_centered", "LLaMA's norms multiply by their weights");
      require(m.embedding_scale == 1.0, "model.embedding_scale", "LLaMA does not scale its embeddings");
      require(!m.post_norms, "model.post_norms", "LLaMA has no norms after attention and the MLP");
      require(m.softmax_scale == 0, "model.softmax_scale", "LLaMA scales attention's scores by 1 / sqrt(head_dim)");
      require(m.attention_softcap == 0, "model.attention_softcap", "LLaMA does not soft-cap attention");
      require(m.final_logit_softcap == 0, "model.final_logit_softcap", "LLaMA does not soft-cap its logits");
    }
    // Query/key norms are Qwen3's architecture; biases on q, k and v alone Qwen2's (LLaMA's
    // attention_bias is all four).
    const bool qwen3 = !gemma && m.qk_norm;
    const bool qwen2 = !gemma && !qwen3 && m.qkv_bias && !m.attention_bias;
    // LLaMA's config has no sliding window; Mistral's (without biases) and Qwen's do.
    const bool mistral = !gemma && !qwen2 && !qwen3 && m.sliding_window > 0;
    // Only Gemma 3 rotates its window's layers by a base of their own; Qwen's full
    // layers are its first max_window_layers; every Mistral layer attends over the window.
    if (!gemma3) require(m.rope_local_theta == 0, "model.rope_local_theta", "only Gemma 3 has a local RoPE base");
    if (mistral)
      require(m.full_attention_layers.empty(), "model.full_attention_layers",
              "every layer of Mistral attends over its sliding window");
    const int64_t leading_full = [&] {
      int64_t k = 0;
      while (k < m.n_layers && !attends_over_window(m, k)) ++k;
      return k;
    }();
    if (qwen2 || qwen3)
      for (int64_t i = leading_full; i < m.n_layers; ++i)
        require(attends_over_window(m, i), "model.full_attention_layers",
                fmt::format("layer {} attends in full after layer {} attended over the window: Qwen's full layers "
                            "are its first max_window_layers",
                            i, leading_full));
    if (qwen3)
      require(!(m.qkv_bias && !m.attention_bias) && !m.mlp_bias, "model.qk_norm",
              "Qwen3 (query/key norms) has biases on all four attention projections or none, and none on its MLP");
    if (qwen2) require(!m.mlp_bias, "model.mlp_bias", "Qwen2 (biases on q, k and v alone) has no MLP biases");
    if (mistral)
      require(!m.attention_bias && !m.mlp_bias, "model.sliding_window",
              "a sliding window is Mistral's, whose projections have no biases");
    // A mixture of experts: Qwen3-MoE with query/key norms, Qwen2-MoE with a gated shared
    // expert, Mixtral with neither.
    const bool moe = m.moe_experts > 0;
    const bool qwen2_moe = moe && m.moe_shared_ffn_dim > 0;
    if (moe) {
      require(!gemma, "model.moe_experts", "a mixture of GeGLU experts has no Hugging Face architecture");
      // DeepSeek-V3's routing has no exported form here (its attention is not tide's).
      require(m.moe_router == MoeRouterScore::Softmax, "model.moe_router",
              "the Hugging Face mixtures tide exports (Mixtral, Qwen-MoE) route by a softmax");
      require(!m.moe_expert_bias, "model.moe_expert_bias",
              "the Hugging Face mixtures tide exports have no routing biases, and leaving them out would route "
              "otherwise");
      require(m.moe_routed_scale == 1.0, "model.moe_routed_scale",
              "the Hugging Face mixtures tide exports do not scale the chosen experts' weights");
      require(m.moe_groups == 1, "model.moe_groups",
              "the Hugging Face mixtures tide exports choose among all the experts");
      if (qwen2_moe) {
        require(m.moe_shared_gate && !qwen3 && !m.attention_bias && !m.mlp_bias, "model.moe_shared_ffn_dim",
                "a mixture of experts with a shared expert is Qwen2-MoE's, whose shared expert is gated and which "
                "has no query/key norms and no biases but on q, k and v");
        require(m.sliding_window == 0, "model.sliding_window",
                "a sliding window is not exported with a shared expert (Qwen2-MoE)");
        require(m.head_dim == 0 || m.head_dim * m.n_heads == m.dim, "model.head_dim",
                "Qwen2-MoE's heads are model.dim / model.n_heads wide");
      } else if (!qwen3) {
        require(m.moe_normalize_top_k && !m.qkv_bias && !m.attention_bias && !m.mlp_bias, "model.moe_experts",
                "a mixture of experts without query/key norms or a shared expert is Mixtral's, which normalises the "
                "chosen probabilities and has no biases");
      }
    }
    const char* type = moe && qwen3 ? "qwen3_moe"
                       : qwen2_moe  ? "qwen2_moe"
                       : moe        ? "mixtral"
                       : gemma3     ? "gemma3_text"
                       : gemma2     ? "gemma2"
                       : gemma      ? "gemma"
                       : qwen3      ? "qwen3"
                       : qwen2      ? "qwen2"
                       : mistral    ? "mistral"
                                    : "llama";
    j = {{"architectures",
          {moe && qwen3 ? "Qwen3MoeForCausalLM"
           : qwen2_moe  ? "Qwen2MoeForCausalLM"
           : moe        ? "MixtralForCausalLM"
           : gemma3     ? "Gemma3ForCausalLM"
           : gemma2     ? "Gemma2ForCausalLM"
           : gemma      ? "GemmaForCausalLM"
           : qwen3      ? "Qwen3ForCausalLM"
           : qwen2      ? "Qwen2ForCausalLM"
           : mistral    ? "MistralForCausalLM"
                        : "LlamaForCausalLM"}},
         {"model_type", type},
         {"hidden_size", m.dim},
         {"intermediate_size", resolved_ffn_dim(m)},
         {"num_attention_heads", m.n_heads},
         {"num_hidden_layers", m.n_layers},
         {"num_key_value_heads", resolved_kv_heads(m)},
         {"head_dim", head_dim(m)},
         {"hidden_act", "silu"},
         {"max_position_embeddings", m.max_seq_len},
         {"rms_norm_eps", m.norm_eps},
         {"rope_theta", m.rope_theta},
         {"vocab_size", m.vocab_size},
         {"tie_word_embeddings", m.tie_embeddings},
         {"attention_bias", m.attention_bias},
         {"mlp_bias", m.mlp_bias},
         {"initializer_range", m.init_std},
         {"torch_dtype", "float32"}};
    if (qwen2 || mistral) j.erase("attention_bias");
    if (gemma || qwen3 || qwen2 || mistral) j.erase("mlp_bias");
    // Both keys: transformers reads hidden_act, other readers of Gemma hidden_activation.
    if (gemma) j["hidden_act"] = j["hidden_activation"] = "gelu_pytorch_tanh";
    if (gemma2 || gemma3) {
      const bool windowed = m.sliding_window > 0;
      j["layer_types"] = layer_types(m);
      j["sliding_window"] = windowed ? m.sliding_window : m.max_seq_len;
      if (gemma3) j["rope_local_base_freq"] = m.rope_local_theta > 0 ? m.rope_local_theta : m.rope_theta;
      j["query_pre_attn_scalar"] =
          m.softmax_scale > 0 ? 1.0 / (m.softmax_scale * m.softmax_scale) : static_cast<double>(head_dim(m));
      // Written either way: Gemma2Config's defaults are caps of 50 and 30.
      const auto cap = [](double c) { return c > 0 ? json(c) : json(nullptr); };
      j["attn_logit_softcapping"] = cap(m.attention_softcap);
      j["final_logit_softcapping"] = cap(m.final_logit_softcap);
    }
    if (mistral) j["sliding_window"] = m.sliding_window;
    if (moe) {
      j["num_experts_per_tok"] = m.moe_top_k;
      if (qwen3 || qwen2_moe) {
        j["num_experts"] = m.moe_experts;
        j["moe_intermediate_size"] = resolved_ffn_dim(m);
        j["norm_topk_prob"] = m.moe_normalize_top_k;
        j["decoder_sparse_step"] = 1;
        j["mlp_only_layers"] = json::array();
        if (qwen2_moe) {
          j["shared_expert_intermediate_size"] = m.moe_shared_ffn_dim;
          j["qkv_bias"] = m.qkv_bias;
          j["use_sliding_window"] = false;
          j.erase("attention_bias");
          j.erase("mlp_bias");
          j.erase("head_dim");
        }
      } else {
        j["num_local_experts"] = m.moe_experts;
        j.erase("attention_bias");
        j.erase("mlp_bias");
        if (!mistral) j["sliding_window"] = nullptr;
      }
    }
    if (qwen3 || qwen2) {
      j["use_sliding_window"] = m.sliding_window > 0;
      if (m.sliding_window > 0) {
        j["sliding_window"] = m.sliding_window;
        j["max_window_layers"] = leading_full;
        j["layer_types"] = layer_types(m);
      }
    }
    if (m.rope_scaling == RopeScaling::Linear) {
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", m.rope_scaling_factor}};
    } else if (m.rope_scaling == RopeScaling::Llama3) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", m.rope_scaling_factor},
                           {"low_freq_factor", m.rope_low_freq_factor},
                           {"high_freq_factor", m.rope_high_freq_factor},
                           {"original_max_position_embeddings", m.rope_original_max_seq_len}};
    } else if (m.rope_scaling == RopeScaling::Yarn) {
      j["rope_scaling"] = {{"rope_type", "yarn"},
                           {"factor", m.rope_scaling_factor},
                           {"original_max_position_embeddings", m.rope_original_max_seq_len},
                           {"beta_fast", m.rope_beta_fast},
                           {"beta_slow", m.rope_beta_slow}};
      if (m.rope_attention_factor > 0) j["rope_scaling"]["attention_factor"] = m.rope_attention_factor;
    }
  } else {
    require(m.norm == NormKind::LayerNorm, "model.norm", "BLOOM uses LayerNorm");
    require(m.positions == PositionKind::ALiBi, "model.positions", "BLOOM uses ALiBi");
    require(m.mlp == MlpKind::GELU && resolved_ffn_dim(m) == 4 * m.dim, "model.mlp", "BLOOM uses a 4*dim GELU MLP");
    require(m.attention_bias && m.mlp_bias, "model.attention_bias", "BLOOM has biases everywhere");
    require(m.embedding_norm, "model.embedding_norm", "BLOOM normalises its embeddings");
    require(m.sliding_window == 0, "model.sliding_window", "BLOOM attends to every earlier token");
    require(!m.norm_zero_centered, "model.norm_zero_centered", "BLOOM's norms multiply by their weights");
    require(m.embedding_scale == 1.0, "model.embedding_scale", "BLOOM does not scale its embeddings");
    require(!m.post_norms, "model.post_norms", "BLOOM has no norms after attention and the MLP");
    require(m.softmax_scale == 0, "model.softmax_scale", "BLOOM scales attention's scores by 1 / sqrt(head_dim)");
    j = {{"architectures", {"BloomForCausalLM"}},
         {"model_type", "bloom"},
         {"hidden_size", m.dim},
         {"n_head", m.n_heads},
         {"n_layer", m.n_layers},
         {"vocab_size", m.vocab_size},
         {"layer_norm_epsilon", m.norm_eps},
         {"apply_residual_connection_post_layernorm", false},
         {"tie_word_embeddings", m.tie_embeddings},
         {"initializer_range", m.init_std},
         {"torch_dtype", "float32"}};
  }
  // tide's own resolution of the model, so a round trip restores every field.
  RunConfig rc;
  rc.model = m;
  j["tide"] = config_to_json(rc)["model"];
  return j;
}

namespace {
// Typed reads of a Hugging Face config.json whose errors name the key and the value.
class HfConfig {
 public:
  // `object`: the key of the object read, when it is not the whole file ("rope_scaling").
  explicit HfConfig(const json& j, std::string object = "") : j_(j), object_(std::move(object)) {
    if (!j_.is_object())
      throw ConfigError(object_.empty() ? "config.json" : "config.json " + object_,
                        "is " + std::string(j_.type_name()) + ", not an object");
  }
  // The first of `keys` present; required when `fallback` is absent.
  int64_t integer(std::initializer_list<const char*> keys, std::optional<int64_t> fallback = std::nullopt) const {
    const auto [key, v] = find(keys, fallback.has_value());
    if (v == nullptr) return *fallback;
    if (!v->is_number_integer()) throw wrong(key, *v, "an integer");
    return v->get<int64_t>();
  }
  double number(const char* key, std::optional<double> fallback = std::nullopt) const {
    const auto [k, v] = find({key}, fallback.has_value());
    if (v == nullptr) return *fallback;
    if (!v->is_number()) throw wrong(k, *v, "a number");
    return v->get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    const auto [k, v] = find({key}, true);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) throw wrong(k, *v, "true or false");
    return v->get<bool>();
  }
  std::string string(const char* key) const {
    const auto [k, v] = find({key}, false);
    if (!v->is_string()) throw wrong(k, *v, "a string");
    return v->get<std::string>();
  }
  const json* get(const char* key) const { return j_.contains(key) && !j_[key].is_null() ? &j_[key] : nullptr; }
  // Said to be null, which for some keys differs from absent (Gemma 2's caps: null is
  // none, absent the class's default).
  bool says_null(const char* key) const { return j_.contains(key) && j_[key].is_null(); }

 private:
  std::pair<std::string, const json*> find(std::initializer_list<const char*> keys, bool optional) const {
    for (const char* k : keys)
      if (const json* v = get(k)) return {k, v};
    if (!optional) throw ConfigError("config.json " + path(*keys.begin()), "missing");
    return {*keys.begin(), nullptr};
  }
  std::string path(const std::string& key) const { return object_.empty() ? key : object_ + "." + key; }
  ConfigError wrong(const std::string& key, const json& v, const char* want) const {
    return ConfigError("config.json " + path(key), v.dump() + " is not " + want);
  }
  const json& j_;
  std::string object_;
};

// Hugging Face's rope_scaling object (`rope_type`, or `type` in older files).
void read_rope_scaling(const json& scaling, ModelConfig& m) {
  const HfConfig hf(scaling, "rope_scaling");
  const bool old_key = hf.get("rope_type") == nullptr && hf.get("type") != nullptr;
  const std::string type = hf.string(old_key ? "type" : "rope_type");
  if (type == "default") return;
  if (type == "linear") {
    m.rope_scaling = RopeScaling::Linear;
  } else if (type == "llama3") {
    m.rope_scaling = RopeScaling::Llama3;
    m.rope_low_freq_factor = hf.number("low_freq_factor", m.rope_low_freq_factor);
    m.rope_high_freq_factor = hf.number("high_freq_factor", m.rope_high_freq_factor);
    m.rope_original_max_seq_len = hf.integer({"original_max_position_embeddings"});
  } else if (type == "yarn") {
    m.rope_scaling = RopeScaling::Yarn;
    // transformers' defaults: the context before scaling is max_position_embeddings.
    m.rope_original_max_seq_len = hf.integer({"original_max_position_embeddings"}, m.max_seq_len);
    m.rope_beta_fast = hf.number("beta_fast", m.rope_beta_fast);
    m.rope_beta_slow = hf.number("beta_slow", m.rope_beta_slow);
    if (!hf.boolean("truncate", true))
      throw ConfigError("config.json rope_scaling.truncate",
                        "false: yarn scaling with an unrounded ramp is not supported");
    if (hf.get("attention_factor") != nullptr) {
      m.rope_attention_factor = hf.number("attention_factor");
    } else if (const double scale = hf.number("mscale", 0), all = hf.number("mscale_all_dim", 0);
               scale != 0 && all != 0) {
      // DeepSeek's form: the ratio of two of YaRN's factors, each 0.1 mscale ln(factor) + 1.
      const double factor = hf.number("factor");
      const auto yarn = [&](double s) { return factor <= 1 ? 1.0 : 0.1 * s * std::log(factor) + 1.0; };
      m.rope_attention_factor = yarn(scale) / yarn(all);
    }
  } else {
    throw ConfigError("config.json rope_scaling.rope_type",
                      fmt::format("'{}' is not a supported RoPE scaling (linear, llama3, yarn)", type));
  }
  m.rope_scaling_factor = hf.number("factor");
}

// The layers that attend in full: those layer_types marks "full_attention", else those
// `sliding_by_default` leaves out. The rest attend over the sliding window.
std::vector<int64_t> full_layers(const HfConfig& hf, const ModelConfig& m,
                                 const std::function<bool(int64_t)>& sliding_by_default) {
  std::vector<int64_t> full;
  const json* types = hf.get("layer_types");
  if (types == nullptr) {
    for (int64_t i = 0; i < m.n_layers; ++i)
      if (!sliding_by_default(i)) full.push_back(i);
    return full;
  }
  if (!types->is_array() || static_cast<int64_t>(types->size()) != m.n_layers)
    throw ConfigError("config.json layer_types",
                      fmt::format("{} is not a list of {} layer types", types->dump().substr(0, 200), m.n_layers));
  for (int64_t i = 0; i < m.n_layers; ++i) {
    const json& t = (*types)[static_cast<size_t>(i)];
    if (t == "full_attention")
      full.push_back(i);
    else if (t != "sliding_attention")
      throw ConfigError(fmt::format("config.json layer_types[{}]", i),
                        fmt::format("{} is neither full_attention nor sliding_attention", t.dump().substr(0, 200)));
  }
  return full;
}

// The window and the layers attending in full despite it (full_layers), where any layer
// attends over the window; the window is `sliding_window`, or `fallback` where the file
// leaves it out. Whether any does.
bool read_layer_windows(const HfConfig& hf, ModelConfig& m, const std::function<bool(int64_t)>& sliding_by_default,
                        std::optional<int64_t> fallback) {
  auto full = full_layers(hf, m, sliding_by_default);
  if (static_cast<int64_t>(full.size()) == m.n_layers) return false;
  m.sliding_window = hf.integer({"sliding_window"}, fallback);
  m.full_attention_layers = std::move(full);
  return true;
}

// Gemma 2's and 3's scores are scaled by query_pre_attn_scalar^-1/2 (one equal to the
// head's width is the default scale).
void read_softmax_scale(const HfConfig& hf, ModelConfig& m) {
  const double scalar = hf.number("query_pre_attn_scalar", 256);
  if (!(scalar > 0))
    throw ConfigError("config.json query_pre_attn_scalar", fmt::format("{} is not a positive number", scalar));
  if (scalar != static_cast<double>(head_dim(m))) m.softmax_scale = 1.0 / std::sqrt(scalar);
}

// Qwen2 and Qwen3 attend over their window in the layers from max_window_layers on (or where
// layer_types says "sliding_attention").
void read_qwen2_window(const HfConfig& hf, ModelConfig& m) {
  if (hf.get("sliding_window") == nullptr) return;
  const int64_t first_windowed = std::max<int64_t>(0, hf.integer({"max_window_layers"}, 28));
  read_layer_windows(
      hf, m, [&](int64_t i) { return i >= first_windowed; }, std::nullopt);
}

// Gemma: gelu in its tanh form gates the MLP, norms multiply by 1 + weight, embeddings
// are scaled by sqrt(hidden_size) (in the stream's dtype), embeddings are tied unless
// the file says otherwise.
void read_gemma(const HfConfig& hf, ModelConfig& m) {
  m.mlp = MlpKind::GeGLU;
  m.norm_zero_centered = true;
  m.embedding_scale = std::sqrt(static_cast<double>(m.dim));
  m.tie_embeddings = hf.boolean("tie_word_embeddings", true);
  // Gemma's files name the activation in hidden_activation, and Gemma 1's also carry the
  // older hidden_act "gelu", which its weights were not trained with: they were trained
  // with the tanh form (transformers#29402), which the serving and training stacks run
  // (text-generation-inference, Megatron-Bridge). So hidden_activation first, and "gelu"
  // read as the tanh form.
  const char* key = hf.get("hidden_activation") != nullptr ? "hidden_activation" : "hidden_act";
  const std::string act = hf.get(key) != nullptr ? hf.string(key) : "gelu_pytorch_tanh";
  if (act != "gelu_pytorch_tanh" && act != "gelu_new" && act != "gelu")
    throw ConfigError(std::string("config.json ") + key,
                      fmt::format("'{}' is not gelu_pytorch_tanh, the tanh form of gelu Gemma's MLP is gated by", act));
}

// A multimodal Gemma 3 (Gemma3ForConditionalGeneration, model_type gemma3: 4B and larger)
// keeps its language model's config under text_config, which leaves out what equals
// Gemma3TextConfig's defaults: those are filled in (transformers 4.57's), and the result
// is a gemma3_text config.
json gemma3_language_model(const json& config) {
  const auto it = config.find("text_config");
  if (it == config.end() || !it->is_object())
    throw ConfigError("config.json text_config", "missing: a gemma3 file describes its language model there");
  json text = {{"vocab_size", 262208},
               {"hidden_size", 2304},
               {"intermediate_size", 9216},
               {"num_hidden_layers", 26},
               {"num_attention_heads", 8},
               {"num_key_value_heads", 4},
               {"head_dim", 256},
               {"max_position_embeddings", 131072},
               {"rms_norm_eps", 1e-6},
               {"rope_theta", 1e6},
               {"rope_local_base_freq", 1e4},
               {"query_pre_attn_scalar", 256},
               {"sliding_window", 4096}};
  if (config.contains("tie_word_embeddings")) text["tie_word_embeddings"] = config["tie_word_embeddings"];
  for (const auto& [key, value] : it->items()) text[key] = value;
  text["model_type"] = "gemma3_text";
  return text;
}

// Gemma 2: Gemma's architecture with norms after attention and the MLP too, scores scaled
// by query_pre_attn_scalar^-1/2, attention's scores and the final logits soft-capped (by
// 50 and 30 unless the file says otherwise; null: none), and every other layer attending
// over a sliding window (the even ones), all rotating alike.
void read_gemma2(const HfConfig& hf, ModelConfig& m) {
  m.post_norms = true;
  const auto cap = [&](const char* key, double fallback) {
    if (hf.says_null(key)) return 0.0;
    const double v = hf.number(key, fallback);
    if (!(v > 0)) throw ConfigError(std::string("config.json ") + key, fmt::format("{} is not a positive cap", v));
    return v;
  };
  m.attention_softcap = cap("attn_logit_softcapping", 50.0);
  m.final_logit_softcap = cap("final_logit_softcapping", 30.0);
  read_softmax_scale(hf, m);
  read_layer_windows(
      hf, m, [](int64_t i) { return i % 2 == 0; }, 4096);
}

// Gemma 3 (text): Gemma's architecture with norms after attention and the MLP too,
// query/key norms, scores scaled by query_pre_attn_scalar^-1/2, and layers that attend
// over a sliding window (with RoPE base rope_local_base_freq, unscaled) or in full (base
// rope_theta, with rope_scaling). Run once the head's width is known.
void read_gemma3(const HfConfig& hf, ModelConfig& m) {
  m.post_norms = true;
  m.qk_norm = true;
  for (const char* cap : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (hf.get(cap) != nullptr)
      throw ConfigError(std::string("config.json ") + cap,
                        fmt::format("{}: soft-capped logits are not supported", hf.get(cap)->dump()));
  if (hf.boolean("use_bidirectional_attention", false))
    throw ConfigError("config.json use_bidirectional_attention", "true: tide's decoder attends causally");
  read_softmax_scale(hf, m);
  m.rope_theta = hf.number("rope_theta", 1e6);  // Gemma3TextConfig's defaults, here and below
  // Without layer_types, every sliding_window_pattern-th layer is a full one.
  const int64_t pattern = hf.integer({"sliding_window_pattern", "_sliding_window_pattern"}, 6);
  if (!read_layer_windows(
          hf, m, [&](int64_t i) { return pattern <= 0 || (i + 1) % pattern != 0; }, 4096))
    return;
  // The window's layers rotate by their own base, unscaled (rope_scaling is the full
  // layers'); where that is what every layer does, there is one base.
  const double local = hf.number("rope_local_base_freq", 10000.0);
  if (local != m.rope_theta || m.rope_scaling != RopeScaling::None) m.rope_local_theta = local;
}

// Mixtral's experts (every block's, their chosen probabilities normalised) or Qwen2- and
// Qwen3-MoE's (of moe_intermediate_size; norm_topk_prob says whether they are; Qwen2-MoE's
// beside a gated shared expert).
void read_experts(const HfConfig& hf, ModelConfig& m, bool mixtral) {
  m.moe_top_k = hf.integer({"num_experts_per_tok"}, 2);
  if (mixtral) {
    m.moe_experts = hf.integer({"num_local_experts"}, 8);
    m.moe_normalize_top_k = true;
    return;
  }
  m.moe_experts = hf.integer({"num_experts"}, 128);
  m.ffn_dim = hf.integer({"moe_intermediate_size"});
  m.moe_normalize_top_k = hf.boolean("norm_topk_prob", false);
  if (hf.string("model_type") == "qwen2_moe") {
    m.moe_shared_ffn_dim = hf.integer({"shared_expert_intermediate_size"});
    m.moe_shared_gate = true;
  }
  if (const int64_t step = hf.integer({"decoder_sparse_step"}, 1); step != 1)
    throw ConfigError("config.json decoder_sparse_step",
                      fmt::format("{}: only every layer a mixture of experts (1) is supported", step));
  if (const json* dense = hf.get("mlp_only_layers"); dense != nullptr && !(dense->is_array() && dense->empty()))
    throw ConfigError("config.json mlp_only_layers",
                      fmt::format("{}: dense layers among the experts' are not supported", dense->dump()));
}
}  // namespace

ModelConfig model_config_from_hf(const json& config) {
  const HfConfig hf(config);
  if (const json* own = hf.get("tide"); own != nullptr && own->is_object()) return model_config_from_json(*own);
  const std::string type = hf.string("model_type");
  if (type == "gemma3") {
    const json text = gemma3_language_model(config);
    try {
      return model_config_from_hf(text);
    } catch (const ConfigError& e) {  // named as the file names it
      const std::string file = "config.json ";
      const std::string field =
          e.field().rfind(file, 0) == 0 ? file + "text_config." + e.field().substr(file.size()) : e.field();
      const std::string message = std::string(e.what()).substr(e.field().empty() ? 0 : e.field().size() + 2);
      throw ConfigError(field, message);
    }
  }
  ModelConfig m;
  // Mistral, Qwen2, Qwen3 and Gemma are LLaMA's architecture under other names: Mistral
  // with a sliding window (v0.1), Qwen2 with biases on q, k and v alone, Qwen3 with
  // query/key norms, Gemma with a GeGLU MLP, zero-centred norms and scaled embeddings.
  const bool gemma = type == "gemma" || type == "gemma2" || type == "gemma3_text";
  const bool mixtral = type == "mixtral", qwen3 = type == "qwen3" || type == "qwen3_moe";
  const bool qwen2 = type == "qwen2" || type == "qwen2_moe";
  if (type == "llama" || type == "mistral" || qwen2 || qwen3 || mixtral || gemma) {
    m.family = Family::LLaMA;
    m.dim = hf.integer({"hidden_size"});
    m.ffn_dim = hf.integer({"intermediate_size"});
    m.n_heads = hf.integer({"num_attention_heads"});
    m.n_layers = hf.integer({"num_hidden_layers"});
    m.n_kv_heads = hf.integer({"num_key_value_heads"}, m.n_heads);
    m.max_seq_len = hf.integer({"max_position_embeddings"}, 2048);
    m.norm_eps = hf.number("rms_norm_eps", 1e-6);
    m.rope_theta = hf.number("rope_theta", 10000.0);
    m.vocab_size = hf.integer({"vocab_size"});
    m.tie_embeddings = hf.boolean("tie_word_embeddings", false);
    if (qwen2 || qwen3) {
      if (type == "qwen2") m.qkv_bias = true;
      if (type == "qwen2_moe") m.qkv_bias = hf.boolean("qkv_bias", true);
      if (qwen3) {
        m.qk_norm = true;
        m.attention_bias = hf.boolean("attention_bias", false);
      }
      if (hf.boolean("use_sliding_window", false)) read_qwen2_window(hf, m);
    } else {
      m.attention_bias = hf.boolean("attention_bias", false);
      m.mlp_bias = hf.boolean("mlp_bias", false);
    }
    // Mistral v0.1's window; v0.3 and later have none.
    if ((type == "mistral" || mixtral) && hf.get("sliding_window") != nullptr)
      m.sliding_window = hf.integer({"sliding_window"});
    if (mixtral || type == "qwen3_moe" || type == "qwen2_moe") read_experts(hf, m, mixtral);
    if (gemma) {
      read_gemma(hf, m);
    } else if (const std::string act = hf.get("hidden_act") != nullptr ? hf.string("hidden_act") : "silu";
               act != "silu") {
      throw ConfigError("config.json hidden_act", fmt::format("'{}' is not silu, the SwiGLU MLP's", act));
    }
    if (const json* scaling = hf.get("rope_scaling")) read_rope_scaling(*scaling, m);
    // A head width of its own (Mistral NeMo's 128 at hidden_size 5120 and 32 heads); one
    // equal to hidden_size / num_attention_heads is the derived width, kept as 0.
    if (hf.get("head_dim") != nullptr || gemma) {
      const int64_t hd = hf.integer({"head_dim"}, 256);  // transformers' default is Gemma's
      if (!(m.n_heads > 0 && m.dim % m.n_heads == 0 && hd == m.dim / m.n_heads)) m.head_dim = hd;
    }
    if (type == "gemma2") read_gemma2(hf, m);
    if (type == "gemma3_text") read_gemma3(hf, m);
    // A window the model's longest sequence fits in leaves nothing out (where its layers
    // rotate alike).
    if (m.sliding_window >= m.max_seq_len && m.rope_local_theta == 0) {
      m.sliding_window = 0;
      m.full_attention_layers.clear();
    }
  } else if (type == "bloom") {
    m.family = Family::BLOOM;
    m.dim = hf.integer({"hidden_size", "n_embed"});
    m.n_heads = hf.integer({"n_head", "num_attention_heads"});
    m.n_layers = hf.integer({"n_layer", "num_hidden_layers"});
    m.vocab_size = hf.integer({"vocab_size"});
    m.norm_eps = hf.number("layer_norm_epsilon", 1e-5);
    m.tie_embeddings = hf.boolean("tie_word_embeddings", true);
    m.norm = NormKind::LayerNorm;
    m.positions = PositionKind::ALiBi;
    m.mlp = MlpKind::GELU;
    m.attention_bias = m.mlp_bias = m.embedding_norm = true;
    m.max_seq_len = hf.integer({"seq_length"}, 2048);
    if (hf.boolean("apply_residual_connection_post_layernorm", false))
      throw ConfigError("config.json apply_residual_connection_post_layernorm", "true is not supported");
  } else {
    throw ConfigError(
        "config.json model_type",
        fmt::format("'{}' is not a supported family (llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, "
                    "gemma, gemma2, gemma3_text, bloom)",
                    type));
  }
  m.init_std = hf.number("initializer_range", 0.02);
  // Through the recipe schema's ranges and rules: config.json is input from outside (a
  // head count of 0 must be an error, not a division by it).
  RunConfig rc;
  rc.model = m;
  try {
    return model_config_from_json(config_to_json(rc)["model"]);
  } catch (const ConfigError& e) {
    throw ConfigError("config.json", fmt::format("gives {}", e.what()));
  }
}

std::vector<std::string> hf_weight_files(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json_file(index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw std::runtime_error(index.string() + ": no 'weight_map' object");
    std::set<std::string> files;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string() || !is_plain_file_name(file.get<std::string>()))
        throw std::runtime_error(index.string() + ": weight_map." + tensor + " = " + file.dump() +
                                 " is not a file name in the directory");
      files.insert(file.get<std::string>());
    }
    std::vector<std::string> out;
    for (const auto& f : files) out.push_back((fs::path(dir) / f).string());
    return out;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(single))
    throw std::runtime_error("'" + dir + "' has neither model.safetensors nor model.safetensors.index.json");
  return {single.string()};
}

namespace {
// Mixtral's names of a mixture of experts' parameters and tide's (Qwen-MoE's), the part
// after "model.layers.<i>.": the router's, and an expert's projection after
// "experts.<e>.".
constexpr std::pair<const char*, const char*> kMixtralRouter{"block_sparse_moe.gate.", "mlp.gate."};
constexpr std::pair<const char*, const char*> kMixtralExperts{"block_sparse_moe.experts.", "mlp.experts."};
constexpr std::pair<const char*, const char*> kMixtralProjections[] = {
    {"w1.", "gate_proj."}, {"w3.", "up_proj."}, {"w2.", "down_proj."}};

// `name` with its MoE part renamed from one side (`from` 0: Mixtral, 1: tide) to the other.
std::string mixtral_renamed(const std::string& name, int from) {
  const auto side = [&](const std::pair<const char*, const char*>& p, int which) {
    return std::string(which == 0 ? p.first : p.second);
  };
  if (const auto at = name.find(side(kMixtralRouter, from)); at != std::string::npos)
    return name.substr(0, at) + side(kMixtralRouter, 1 - from) + name.substr(at + side(kMixtralRouter, from).size());
  const auto at = name.find(side(kMixtralExperts, from));
  if (at == std::string::npos) return name;
  const auto index = at + side(kMixtralExperts, from).size();
  const auto dot = name.find('.', index);
  if (dot == std::string::npos) return name;
  for (const auto& projection : kMixtralProjections)
    if (name.compare(dot + 1, side(projection, from).size(), side(projection, from)) == 0)
      return name.substr(0, at) + side(kMixtralExperts, 1 - from) + name.substr(index, dot + 1 - index) +
             side(projection, 1 - from) + name.substr(dot + 1 + side(projection, from).size());
  return name;
}
}  // namespace

std::string hf_export_name(const ModelConfig& m, const std::string& name) {
  return m.moe_experts > 0 && !m.qk_norm && m.moe_shared_ffn_dim == 0 ? mixtral_renamed(name, 1) : name;
}

std::function<std::string(const std::string&)> hf_parameter_name(const ModelConfig& m, const json& config) {
  const std::string prefix = m.family == Family::BLOOM ? "transformer." : "";
  const bool multimodal = config.is_object() && config.value("model_type", "") == "gemma3";
  const bool mixtral = config.is_object() && config.value("model_type", "") == "mixtral";
  return [prefix, multimodal, mixtral, tied = m.tie_embeddings](const std::string& file_name) -> std::string {
    std::string name = mixtral ? mixtral_renamed(file_name, 0) : file_name;
    if (multimodal) {
      // As transformers saves it (language_model.model.*, language_model.lm_head.*) and
      // as it names it in memory since 4.52 (model.language_model.*, lm_head.*).
      const auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
      for (const char* other :
           {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."})
        if (starts(other)) return "";
      if (starts("language_model.model."))
        name = "model." + name.substr(std::string("language_model.model.").size());
      else if (starts("model.language_model."))
        name = "model." + name.substr(std::string("model.language_model.").size());
      else if (starts("language_model.lm_head."))
        name = name.substr(std::string("language_model.").size());
    }
    if (tied && name == "lm_head.weight") return "";
    if (!prefix.empty() && name.rfind(prefix, 0) != 0 && name != "lm_head.weight") return prefix + name;
    return name;
  };
}

}  // namespace tide
