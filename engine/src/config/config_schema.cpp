#include "tide/engine/config_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/engine/io/http_url.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/io/utf8.h"
#include "tide/engine/run_layout.h"

namespace tide {
namespace {

using json = nlohmann::json;

std::string show(const json& v) { return v.dump(); }

// Integer bounds are below 2^53, so they are exact as doubles and as int64.
int64_t as_int(const std::string& path, const json& v, double lo, double hi) {
  const auto lo_i = static_cast<int64_t>(lo), hi_i = static_cast<int64_t>(hi);
  auto out_of_range = [&] {
    return ConfigError(path, fmt::format("{} is out of range [{}, {}]", show(v), lo_i, hi_i));
  };
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi_i)) throw out_of_range();
  if (v.is_number_integer()) {  // compared as integers: 2^53 + 1 is not rounded to 2^53
    const int64_t x = v.get<int64_t>();
    if (x < lo_i || x > hi_i) throw out_of_range();
    return x;
  }
  if (!v.is_number_float() || std::floor(v.get<double>()) != v.get<double>())
    throw ConfigError(path, fmt::format("expected an integer, got {}", show(v)));
  const double x = v.get<double>();
  if (x < lo || x > hi) throw out_of_range();
  return static_cast<int64_t>(x);
}

double as_number(const std::string& path, const json& v, double lo, double hi) {
  if (!v.is_number()) throw ConfigError(path, fmt::format("expected a number, got {}", show(v)));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw ConfigError(path, fmt::format("{} is out of range [{}, {}]", show(v), lo, hi));
  return x;
}

// 2^53 - 1: every integer up to it is exact in a Lua number (a double), so a recipe's
// value is never silently another one.
constexpr double kBig = 9007199254740991.0;

const std::vector<std::pair<std::string, DType>>& compute_dtypes() {
  static const std::vector<std::pair<std::string, DType>> dtypes = {
      {"auto", DType::Auto}, {"fp32", DType::Float32}, {"bf16", DType::BFloat16}, {"fp16", DType::Float16}};
  return dtypes;
}

const std::vector<std::pair<std::string, AnomalyAction>>& anomaly_actions() {
  static const std::vector<std::pair<std::string, AnomalyAction>> actions = {{"none", AnomalyAction::None},
                                                                             {"skip", AnomalyAction::Skip},
                                                                             {"rollback", AnomalyAction::Rollback},
                                                                             {"scale_lr", AnomalyAction::ScaleLr},
                                                                             {"stop", AnomalyAction::Stop}};
  return actions;
}

template <class F>
FieldSpec integer(std::string path, double lo, double hi, LiveEffect live, std::string doc, F ref) {
  FieldSpec f{path, FieldType::Int, {}, lo, hi, live, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) { ref(c) = as_int(path, v, lo, hi); };
  f.get = [=](const RunConfig& c) { return json(ref(const_cast<RunConfig&>(c))); };
  return f;
}

template <class F>
FieldSpec number(std::string path, double lo, double hi, LiveEffect live, std::string doc, F ref) {
  FieldSpec f{path, FieldType::Number, {}, lo, hi, live, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) { ref(c) = as_number(path, v, lo, hi); };
  f.get = [=](const RunConfig& c) { return json(ref(const_cast<RunConfig&>(c))); };
  return f;
}

template <class F>
FieldSpec boolean(std::string path, LiveEffect live, std::string doc, F ref) {
  FieldSpec f{path, FieldType::Bool, {}, 0, 1, live, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) {
    if (!v.is_boolean()) throw ConfigError(path, fmt::format("expected true or false, got {}", show(v)));
    ref(c) = v.get<bool>();
  };
  f.get = [=](const RunConfig& c) { return json(ref(const_cast<RunConfig&>(c))); };
  return f;
}

template <class F>
FieldSpec string(std::string path, LiveEffect live, std::string doc, F ref) {
  FieldSpec f{path, FieldType::String, {}, 0, 0, live, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) {
    if (!v.is_string()) throw ConfigError(path, fmt::format("expected a string, got {}", show(v)));
    ref(c) = v.get<std::string>();
  };
  f.get = [=](const RunConfig& c) { return json(ref(const_cast<RunConfig&>(c))); };
  return f;
}

template <class F>
FieldSpec int_list(std::string path, double lo, double hi, std::string doc, F ref) {
  FieldSpec f{path, FieldType::IntList, {}, lo, hi, LiveEffect::None, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) {
    std::vector<int64_t> out;
    // An empty Lua table converts to an empty object.
    if (v.is_object() && v.empty()) {
      ref(c) = std::move(out);
      return;
    }
    if (!v.is_array()) throw ConfigError(path, fmt::format("expected a list of integers, got {}", show(v)));
    for (size_t i = 0; i < v.size(); ++i) out.push_back(as_int(fmt::format("{}[{}]", path, i + 1), v[i], lo, hi));
    ref(c) = std::move(out);
  };
  f.get = [=](const RunConfig& c) { return json(ref(const_cast<RunConfig&>(c))); };
  return f;
}

// A list of http(s) URLs (a Lua table of strings; an empty table reads as {} or []).
template <class F>
FieldSpec url_list(const std::string& path, size_t most, std::string doc, F ref) {
  FieldSpec f{path, FieldType::UrlList, {}, 0, static_cast<double>(most), LiveEffect::None, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) {
    if (v.is_object() && v.empty()) {
      ref(c).clear();
      return;
    }
    if (!v.is_array()) throw ConfigError(path, fmt::format("expected a list of URLs, got {}", show(v)));
    if (v.size() > most) throw ConfigError(path, fmt::format("has {} URLs; {} at most", v.size(), most));
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string where = fmt::format("{}[{}]", path, i + 1);
      if (!v[i].is_string()) throw ConfigError(where, fmt::format("expected a URL string, got {}", show(v[i])));
      try {
        parse_http_url(v[i].get<std::string>(), "URL");
      } catch (const std::invalid_argument& e) {
        throw ConfigError(where, e.what());
      }
      out.push_back(v[i].get<std::string>());
    }
    ref(c) = std::move(out);
  };
  f.get = [=](const RunConfig& c) { return json(ref(const_cast<RunConfig&>(c))); };
  return f;
}

// A list of distinct names, each one of `names` (a Lua table of strings; an empty table
// reads as {} or []).
template <class F>
FieldSpec choice_list(const std::string& path, const std::vector<std::string>& names, std::string doc, F ref) {
  FieldSpec f{path, FieldType::ChoiceList, names, 0, 0, LiveEffect::None, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) {
    if (v.is_object() && v.empty()) {
      ref(c).clear();
      return;
    }
    if (!v.is_array()) throw ConfigError(path, fmt::format("expected a list of names, got {}", show(v)));
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string where = fmt::format("{}[{}]", path, i + 1);
      if (!v[i].is_string() || std::find(names.begin(), names.end(), v[i].get<std::string>()) == names.end())
        throw ConfigError(where, fmt::format("{} is not one of {}", show(v[i]), fmt::join(names, ", ")));
      const auto& name = v[i].get_ref<const std::string&>();
      if (const auto seen = std::find(out.begin(), out.end(), name); seen != out.end())
        throw ConfigError(where, fmt::format("{} is {}[{}] too", show(v[i]), path, seen - out.begin() + 1));
      out.push_back(name);
    }
    ref(c) = std::move(out);
  };
  f.get = [=](const RunConfig& c) { return json(ref(const_cast<RunConfig&>(c))); };
  return f;
}

// Names that become directories, metric keys and event topics: letters, digits, '.',
// '_' and '-', 64 at most, not starting with '.'.
bool is_plain_name(const std::string& s) {
  return !s.empty() && s.size() <= 64 && s[0] != '.' && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
  });
}
constexpr char kPlainNameRule[] = "letters, digits, '.', '_' and '-' (64 at most, not starting with '.')";

// A list of datasets, each a table {path = DIR, weight = W, name = NAME}: weight and
// name optional.
template <class F>
FieldSpec source_list(const std::string& path, size_t most, std::string doc, F ref) {
  FieldSpec f{path, FieldType::SourceList, {}, 0, static_cast<double>(most), LiveEffect::None, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) {
    if (v.is_object() && v.empty()) {
      ref(c).clear();
      return;
    }
    if (!v.is_array())
      throw ConfigError(path, fmt::format("expected a list of {{path = ..., weight = ...}} tables, got {}", show(v)));
    if (v.size() > most) throw ConfigError(path, fmt::format("has {} datasets; {} at most", v.size(), most));
    std::vector<DataSource> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string where = fmt::format("{}[{}]", path, i + 1);
      const json& e = v[i];
      if (!e.is_object())
        throw ConfigError(where, fmt::format("expected a table {{path = ..., weight = ...}}, got {}", show(e)));
      DataSource d;
      for (auto it = e.begin(); it != e.end(); ++it) {
        const std::string& key = it.key();
        const json& value = it.value();
        if (key == "path") {
          if (!value.is_string() || value.get<std::string>().empty())
            throw ConfigError(where + ".path", fmt::format("expected a dataset directory, got {}", show(value)));
          d.path = value.get<std::string>();
        } else if (key == "weight") {
          d.weight = as_number(where + ".weight", value, 0, 1e9);
          if (d.weight <= 0) throw ConfigError(where + ".weight", fmt::format("{} is not above 0", show(value)));
        } else if (key == "name") {
          if (!value.is_string() || !is_plain_name(value.get<std::string>()))
            throw ConfigError(where + ".name", fmt::format("{} may hold only {}", show(value), kPlainNameRule));
          d.name = value.get<std::string>();
        } else {
          throw ConfigError(where, fmt::format("unknown key {} (path, weight, name)", json(key).dump()));
        }
      }
      if (d.path.empty()) throw ConfigError(where + ".path", "missing: the dataset's directory");
      out.push_back(std::move(d));
    }
    ref(c) = std::move(out);
  };
  f.get = [=](const RunConfig& c) {
    json out = json::array();
    for (const auto& d : ref(const_cast<RunConfig&>(c))) {
      json e = {{"path", d.path}, {"weight", d.weight}};
      if (!d.name.empty()) e["name"] = d.name;
      out.push_back(std::move(e));
    }
    return out;
  };
  return f;
}

template <class E, class F>
FieldSpec choice(std::string path, std::vector<std::pair<std::string, E>> names, LiveEffect live, std::string doc, F ref) {
  std::vector<std::string> labels;
  for (auto& n : names) labels.push_back(n.first);
  FieldSpec f{path, FieldType::Choice, labels, 0, 0, live, std::move(doc), {}, {}};
  f.set = [=](RunConfig& c, const json& v) {
    if (v.is_string()) {
      std::string s = v.get<std::string>();
      std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
      for (auto& n : names)
        if (n.first == s) {
          ref(c) = n.second;
          return;
        }
    }
    throw ConfigError(path, fmt::format("{} is not one of {}", show(v), fmt::join(labels, ", ")));
  };
  f.get = [=](const RunConfig& c) {
    for (auto& n : names)
      if (n.second == ref(const_cast<RunConfig&>(c))) return json(n.first);
    return json(nullptr);
  };
  return f;
}

// Not live: fixed for the run's life.
constexpr LiveEffect kFixed = LiveEffect::None;

#define REF(member) [](RunConfig& c) -> auto& { return c.member; }

void add_top_level_fields(std::vector<FieldSpec>& s) {
  s.push_back(string("name", kFixed,
                     "Run name, used for the run directory: letters, digits, '.', '_' and '-', 64 at most, not "
                     "starting with '.'.",
                     REF(name)));
  s.push_back(integer("seed", 0, kBig, kFixed, "Seed of initialisation, data order and dropout.", REF(seed)));
  s.push_back(integer("log_every", 1, 1e9, LiveEffect::EachStep, "Steps between progress lines.", REF(log_every)));
  s.push_back(choice<std::string>("log_level",
                                  {{"trace", "trace"}, {"debug", "debug"}, {"info", "info"}, {"warn", "warn"},
                                   {"error", "error"}},
                                  LiveEffect::LogLevel, "Level of the run log (train.log).", REF(log_level)));
  s.push_back(choice<std::string>("device", {{"cpu", "cpu"}, {"cuda", "cuda"}}, kFixed,
                                  "Where each rank computes: cpu, or cuda (GPU LOCAL_RANK; with parallel.backend = gloo, LOCAL_RANK modulo the GPUs).",
                                  REF(device)));
  s.push_back(integer("threads", 0, 1024, kFixed, "Intra-op threads per process; 0: the cores available.", REF(threads)));
  s.push_back(boolean("cuda_graphs", kFixed,
                      "On a CUDA device, capture the step (forward, backward, update) as CUDA graphs once its shapes "
                      "are fixed and replay them; the run log says what prevents it. false: launch every kernel.",
                      REF(cuda_graphs)));
}

void add_model_fields(std::vector<FieldSpec>& s) {
  // Model.
  s.push_back(choice<Family>("model.family", {{"llama", Family::LLaMA}, {"bloom", Family::BLOOM}}, kFixed,
                             "Parameter names and QKV layout of this Hugging Face family.", REF(model.family)));
  s.push_back(integer("model.vocab_size", 2, 1e8, kFixed, "Vocabulary size.", REF(model.vocab_size)));
  s.push_back(integer("model.dim", 1, 1e6, kFixed, "Hidden size.", REF(model.dim)));
  s.push_back(integer("model.n_layers", 1, 1e4, kFixed, "Transformer blocks.", REF(model.n_layers)));
  s.push_back(integer("model.n_heads", 1, 1e5, kFixed, "Query heads.", REF(model.n_heads)));
  s.push_back(integer("model.n_kv_heads", 0, 1e5, kFixed, "Key/value heads (grouped-query attention); 0: n_heads.",
                      REF(model.n_kv_heads)));
  s.push_back(integer("model.head_dim", 0, 1e5, kFixed,
                      "Width of each attention head; 0: dim / n_heads. Mistral NeMo and Qwen3 set their own.",
                      REF(model.head_dim)));
  s.push_back(integer("model.ffn_dim", 0, 1e7, kFixed, "MLP hidden size; 0: derived from dim.", REF(model.ffn_dim)));
  s.push_back(integer("model.multiple_of", 1, 1e6, kFixed, "SwiGLU hidden size rounds up to this.",
                      REF(model.multiple_of)));
  s.push_back(number("model.ffn_dim_multiplier", 0, 100, kFixed, "Scales the SwiGLU hidden size; 0: off.",
                     REF(model.ffn_dim_multiplier)));
  s.push_back(integer("model.max_seq_len", 1, 1e7, kFixed, "Longest sequence (learned positions, RoPE tables).",
                      REF(model.max_seq_len)));
  s.push_back(choice<NormKind>("model.norm", {{"rmsnorm", NormKind::RMSNorm}, {"layernorm", NormKind::LayerNorm}},
                               kFixed, "Normalisation.", REF(model.norm)));
  s.push_back(number("model.norm_eps", 1e-12, 1, kFixed, "Norm epsilon.", REF(model.norm_eps)));
  s.push_back(boolean("model.post_norms", kFixed,
                      "A norm on attention's and the MLP's outputs too, before each joins the residual stream "
                      "(Gemma 2 and 3: four norms a block).",
                      REF(model.post_norms)));
  s.push_back(boolean("model.norm_zero_centered", kFixed,
                      "Norms multiply by 1 + weight, weights starting at 0 (Gemma; Megatron-Core's "
                      "layernorm_zero_centered_gamma).",
                      REF(model.norm_zero_centered)));
  s.push_back(choice<PositionKind>(
      "model.positions",
      {{"rope", PositionKind::RoPE}, {"alibi", PositionKind::ALiBi}, {"learned", PositionKind::Learned}}, kFixed,
      "Position encoding.", REF(model.positions)));
  s.push_back(number("model.rope_theta", 1, 1e12, kFixed, "RoPE base.", REF(model.rope_theta)));
  s.push_back(choice<RopeScaling>(
      "model.rope_scaling",
      {{"none", RopeScaling::None},
       {"linear", RopeScaling::Linear},
       {"llama3", RopeScaling::Llama3},
       {"yarn", RopeScaling::Yarn}},
      kFixed,
      "RoPE frequencies stretched for a longer context (Hugging Face's rope_scaling): linear divides each by "
      "rope_scaling_factor; llama3 (Llama 3.1 and later) divides the low ones, keeps the high ones and blends "
      "between; yarn (YaRN, Qwen2.5) does so by dimension and scales attention.",
      REF(model.rope_scaling)));
  s.push_back(number("model.rope_scaling_factor", 1, 1e6, kFixed, "How much longer the context is (rope_scaling).",
                     REF(model.rope_scaling_factor)));
  s.push_back(number("model.rope_low_freq_factor", 1e-6, 1e6, kFixed,
                     "llama3 scaling: wavelengths over rope_original_max_seq_len / this are divided by the factor.",
                     REF(model.rope_low_freq_factor)));
  s.push_back(number("model.rope_high_freq_factor", 1e-6, 1e6, kFixed,
                     "llama3 scaling: wavelengths under rope_original_max_seq_len / this are kept.",
                     REF(model.rope_high_freq_factor)));
  s.push_back(integer("model.rope_original_max_seq_len", 1, 1e9, kFixed,
                      "llama3 and yarn scaling: the context the model was pretrained with.",
                      REF(model.rope_original_max_seq_len)));
  s.push_back(number("model.rope_beta_fast", 1e-6, 1e6, kFixed,
                     "yarn scaling: frequencies turning more often than this over the original context are kept.",
                     REF(model.rope_beta_fast)));
  s.push_back(number("model.rope_beta_slow", 1e-6, 1e6, kFixed,
                     "yarn scaling: frequencies turning less often than this are divided by the factor.",
                     REF(model.rope_beta_slow)));
  s.push_back(number("model.rope_attention_factor", 0, 100, kFixed,
                     "yarn scaling: cos and sin are scaled by this; 0: 0.1 ln(rope_scaling_factor) + 1.",
                     REF(model.rope_attention_factor)));
  s.push_back(integer("model.sliding_window", 0, 1e9, kFixed,
                      "A token attends to itself and this many - 1 tokens before it (Mistral, Qwen2); 0: to all before "
                      "it. Costs nothing while data.seq_len is at most this.",
                      REF(model.sliding_window)));
  s.push_back(int_list("model.full_attention_layers", 0, 1e6,
                       "With model.sliding_window, the layers (counted from 0) that attend to every earlier token all "
                       "the same (Gemma 3: one in six; Qwen2: the first max_window_layers); empty: none.",
                       REF(model.full_attention_layers)));
  s.push_back(number("model.rope_local_theta", 0, 1e12, kFixed,
                     "The RoPE base of the layers attending over model.sliding_window, unscaled (Gemma 3's "
                     "rope_local_base_freq); rope_theta and rope_scaling are then the full layers'. 0: rope_theta.",
                     REF(model.rope_local_theta)));
  s.push_back(number("model.softmax_scale", 0, 1e3, kFixed,
                     "Attention's scores are multiplied by this before the softmax; 0: 1 / sqrt(head_dim). Gemma 2 "
                     "and 3 set query_pre_attn_scalar^-1/2 (Megatron-Core's softmax_scale).",
                     REF(model.softmax_scale)));
  s.push_back(number("model.attention_softcap", 0, 1e6, kFixed,
                     "> 0: attention's scores become cap * tanh(score / cap) before the softmax (Gemma 2: 50). "
                     "Materialises the scores (no fused attention kernel takes a cap).",
                     REF(model.attention_softcap)));
  s.push_back(number("model.final_logit_softcap", 0, 1e6, kFixed,
                     "> 0: the logits become cap * tanh(logit / cap) before the loss and sampling (Gemma 2: 30).",
                     REF(model.final_logit_softcap)));
  s.push_back(choice<MlpKind>("model.mlp",
                              {{"swiglu", MlpKind::SwiGLU}, {"geglu", MlpKind::GeGLU}, {"gelu", MlpKind::GELU}}, kFixed,
                              "MLP kind: swiglu down(silu(gate) * up) (LLaMA), geglu down(gelu(gate) * up) (Gemma), "
                              "gelu down(gelu(up)) (BLOOM); GELU is the tanh form.",
                              REF(model.mlp)));
  s.push_back(
      integer("model.moe_experts", 0, 1024, kFixed,
              "> 0: each block's MLP is a mixture of this many experts of model.mlp's kind and model.ffn_dim's "
              "width (Mixtral, Qwen3-MoE); a router sends each token to model.moe_top_k of them. Dropless unless "
              "model.moe_capacity_factor. "
              "0: one dense MLP.",
              REF(model.moe_experts)));
  s.push_back(integer("model.moe_top_k", 1, 1024, kFixed, "Experts each token is sent to (model.moe_experts > 0).",
                      REF(model.moe_top_k)));
  s.push_back(boolean("model.moe_normalize_top_k", kFixed,
                      "The chosen experts' router probabilities divided by their sum (Mixtral, Qwen3-MoE's "
                      "norm_topk_prob); false: the softmax's values as they are (Qwen2-MoE, OLMoE).",
                      REF(model.moe_normalize_top_k)));
  s.push_back(number("model.moe_aux_loss", 0, 1e3, kFixed,
                     "Load-balancing loss coefficient: each block adds coef * E * sum_e f_e P_e (Switch Transformer; "
                     "Megatron-Core's moe_aux_loss_coeff; 1 at a perfect balance) to the gradients; the reported loss "
                     "is the language model's, the balance is reported as moe_balance.",
                     REF(model.moe_aux_loss)));
  s.push_back(choice<MoeBalanceScope>(
      "model.moe_balance_scope",
      {{"micro_batch", MoeBalanceScope::MicroBatch}, {"sequence", MoeBalanceScope::Sequence}}, kFixed,
      "What the load balance (model.moe_aux_loss, moe_balance) is taken over: each micro-batch's tokens "
      "(Megatron-Core's aux_loss), or each sequence's, averaged over the sequences (DeepSeek-V3's sequence-wise "
      "balance loss; seq_aux_loss).",
      REF(model.moe_balance_scope)));
  s.push_back(integer("model.moe_shared_ffn_dim", 0, 1 << 20, kFixed,
                      "> 0: a shared expert of this width beside the routed ones, every token through it and its "
                      "output added to theirs (Qwen2-MoE's shared_expert_intermediate_size; DeepSeek's shared "
                      "experts). 0: none.",
                      REF(model.moe_shared_ffn_dim)));
  s.push_back(boolean("model.moe_shared_gate", kFixed,
                      "The shared expert's output scaled per token by sigmoid(w . x), w a learned [1, dim] "
                      "(Qwen2-MoE's shared_expert_gate); false: added as it is (DeepSeek).",
                      REF(model.moe_shared_gate)));
  s.push_back(choice<MoeRouterScore>(
      "model.moe_router", {{"softmax", MoeRouterScore::Softmax}, {"sigmoid", MoeRouterScore::Sigmoid}}, kFixed,
      "The router's scores: softmax over the experts (Mixtral, Qwen-MoE) or each expert's sigmoid (DeepSeek-V3); "
      "the chosen ones normalised as model.moe_normalize_top_k says.",
      REF(model.moe_router)));
  s.push_back(number("model.moe_routed_scale", 1e-6, 1e6, kFixed,
                     "The chosen experts' weights times this (DeepSeek-V3's routed_scaling_factor, 2.5).",
                     REF(model.moe_routed_scale)));
  s.push_back(boolean("model.moe_expert_bias", kFixed,
                      "Auxiliary-loss-free balancing (DeepSeek-V3): a bias per expert in each block "
                      "(mlp.expert_bias), added to the scores to choose experts and not to weigh them, moved after "
                      "each step by model.moe_bias_update_rate toward the even load. Saved with the weights.",
                      REF(model.moe_expert_bias)));
  s.push_back(number("model.moe_bias_update_rate", 0, 1e3, kFixed,
                     "model.moe_expert_bias: after each optimizer step b_e += rate * sign(mean load - load_e), the "
                     "loads those of the step's whole batch (DeepSeek-V3's gamma, 0.001; 0 holds the biases).",
                     REF(model.moe_bias_update_rate)));
  s.push_back(integer("model.moe_groups", 1, 1024, kFixed,
                      "Group-limited routing (DeepSeek-V3's n_group): the experts in this many equal groups, each "
                      "token choosing within its model.moe_group_top_k best groups (by the sum of each group's top "
                      "model.moe_top_k / model.moe_group_top_k scores). 1: no limit.",
                      REF(model.moe_groups)));
  s.push_back(integer("model.moe_group_top_k", 1, 1024, kFixed,
                      "Groups each token chooses its experts from (DeepSeek-V3's topk_group), model.moe_groups > 1.",
                      REF(model.moe_group_top_k)));
  s.push_back(number("model.moe_z_loss", 0, 1e3, kFixed,
                     "Router z-loss coefficient (ST-MoE; Megatron-Core's moe_z_loss_coeff): each block adds coef * "
                     "mean(logsumexp(router logits)^2) to the gradients. 0: none.",
                     REF(model.moe_z_loss)));
  s.push_back(number("model.moe_capacity_factor", 0, 1e3, kFixed,
                     "> 0: in training each expert takes at most ceil(factor * N k / E) of a micro-batch's N k "
                     "(token, choice) pairs on a rank, the rest dropped as model.moe_drop_policy says (Megatron-Core's "
                     "moe_expert_capacity_factor); evaluation and generation drop nothing. 0: dropless.",
                     REF(model.moe_capacity_factor)));
  s.push_back(choice<MoeDropPolicy>(
      "model.moe_drop_policy", {{"probs", MoeDropPolicy::Probs}, {"position", MoeDropPolicy::Position}}, kFixed,
      "Which pairs over an expert's capacity are dropped: those of the lowest router weights (probs) or of the "
      "latest tokens (position).",
      REF(model.moe_drop_policy)));
  s.push_back(boolean("model.attention_bias", kFixed, "Biases on attention projections.", REF(model.attention_bias)));
  s.push_back(boolean("model.qkv_bias", kFixed,
                      "Biases on the query, key and value projections, none on the output's (Qwen2); "
                      "model.attention_bias puts them on all four.",
                      REF(model.qkv_bias)));
  s.push_back(boolean("model.qk_norm", kFixed,
                      "RMSNorm over each head's query and key before RoPE (Qwen3); its weights have a head's width.",
                      REF(model.qk_norm)));
  s.push_back(boolean("model.mlp_bias", kFixed, "Biases on MLP projections.", REF(model.mlp_bias)));
  s.push_back(boolean("model.embedding_norm", kFixed, "LayerNorm after the token embedding (BLOOM).",
                      REF(model.embedding_norm)));
  s.push_back(number("model.embedding_scale", 1e-6, 1e6, kFixed,
                     "Token embeddings are multiplied by this on the way in (Gemma: sqrt(dim)), not on the way out "
                     "when tied.",
                     REF(model.embedding_scale)));
  s.push_back(boolean("model.tie_embeddings", kFixed, "Output projection shares the embedding.",
                      REF(model.tie_embeddings)));
  s.push_back(number("model.dropout", 0, 1, kFixed, "Dropout on attention probabilities and residual branches.",
                     REF(model.dropout)));
  s.push_back(number("model.init_std", 0, 10, kFixed, "Std of the normal initialisation.", REF(model.init_std)));
  s.push_back(boolean("model.scale_residual_init", kFixed, "Output projections get std / sqrt(2 n_layers).",
                      REF(model.scale_residual_init)));
  s.push_back(boolean("model.activation_checkpointing", kFixed, "Recompute each block in backward.",
                      REF(model.activation_checkpointing)));
  s.push_back(integer("model.recompute_blocks", 0, 1e4, kFixed,
                      "With activation checkpointing, recompute only the first N blocks of each pipeline chunk "
                      "(Megatron-Core's recompute_num_layers); 0: every block.",
                      REF(model.recompute_blocks)));
  s.push_back(
      integer("model.lora_rank", 0, 4096, kFixed,
              "> 0: LoRA fine-tuning. Each projection of model.lora_targets gains (lora_alpha / lora_rank) B "
              "A of this rank, only A and B train, every other weight keeps its initial values "
              "(checkpoint.init_from). Checkpoints hold the adapters; the final weights are merged. Any "
              "layout; ZeRO-3 shards the frozen weights too. Under bf16 (fp16) compute the frozen matrices are held "
              "in that dtype.",
              REF(model.lora_rank)));
  s.push_back(number("model.lora_alpha", 1e-6, 1e6, kFixed,
                     "LoRA's scale numerator: the update is (lora_alpha / lora_rank) B A (PEFT's lora_alpha).",
                     REF(model.lora_alpha)));
  s.push_back(number("model.lora_dropout", 0, 1, kFixed,
                     "LoRA: dropout on each adapter's input while training (PEFT's lora_dropout), below 1; the frozen "
                     "projection reads its input whole.",
                     REF(model.lora_dropout)));
  s.push_back(choice_list("model.lora_targets",
                          {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                           "query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"},
                          "The projections that take LoRA adapters, by Hugging Face module name (LLaMA: q_proj ... "
                          "down_proj; BLOOM: query_key_value, dense, dense_h_to_4h, dense_4h_to_h); empty: every "
                          "projection of the blocks (PEFT's all-linear).",
                          REF(model.lora_targets)));
}

void add_batch_and_optimizer_fields(std::vector<FieldSpec>& s) {
  // Data and batch.
  s.push_back(string("data.path", kFixed, "Dataset directory written by `tide data prepare`.", REF(data.path)));
  s.push_back(source_list("data.blend", 64,
                          "Instead of data.path: datasets {path = DIR, weight = W, name = NAME} that training "
                          "samples draw from in proportion to their weights (Megatron-LM's data blend); one "
                          "tokenizer for all. Validation reports each one's loss (by name: the directory's by "
                          "default) and their weighted mean.",
                          REF(data.blend)));
  s.push_back(integer("data.seq_len", 1, 1e7, kFixed, "Tokens per training sequence.", REF(data.seq_len)));
  s.push_back(integer("data.prefetch", 0, 1024, kFixed, "Batches the loader prepares ahead.", REF(data.prefetch)));
  s.push_back(boolean("data.document_attention", kFixed,
                      "A token attends only to earlier tokens of its own document, not to the documents packed "
                      "before it in the sequence (Megatron-LM's reset_attention_mask, Llama 3's document "
                      "mask); learned positions restart at each document. Validation is masked likewise.",
                      REF(data.document_attention)));
  s.push_back(boolean("data.eod_mask_loss", kFixed,
                      "Leave out of the loss each document's last token predicting the next document's first, "
                      "which nothing before it in the sequence tells (Megatron-LM's eod_mask_loss). The loss is "
                      "then the mean over the step's counted targets, across micro-batches and data-parallel "
                      "ranks. Validation is masked likewise.",
                      REF(data.eod_mask_loss)));
  s.push_back(boolean("data.loss_mask", kFixed,
                      "Count in the loss only the targets each dataset's loss mask marks (`tide data prepare "
                      "--format prompt-completion` marks the completions and their end-of-text, not the prompts; "
                      "`--format messages` what the assistant says; torchtune's train_on_input = false). Every dataset "
                      "must have one. The loss is the mean "
                      "over the step's counted targets, as with data.eod_mask_loss. Validation is masked likewise.",
                      REF(data.loss_mask)));
  s.push_back(boolean(
      "data.document_windows", kFixed,
      "Start each training sequence at a document's first token (the documents after it packed "
      "behind it) instead of anywhere in the token stream, so no example is cut from its start: "
      "a fine-tuning example keeps its prompt, a conversation its start. Drawn at random among the documents that "
      "start a full sequence, deterministic given the seed.",
      REF(data.document_windows)));
  s.push_back(integer("batch.micro_batch", 1, 1e6, kFixed, "Sequences per forward/backward.", REF(batch.micro_batch)));
  s.push_back(integer("batch.global_batch", 1, 1e9, LiveEffect::EachStep,
                      "Sequences per optimizer step; a multiple of micro_batch (gradient accumulation).",
                      REF(batch.global_batch)));
  // Optimizer.
  s.push_back(number("optimizer.lr", 0, 10, LiveEffect::LrSchedule, "Peak learning rate.", REF(optimizer.lr)));
  s.push_back(number("optimizer.beta1", 0, 0.999999, kFixed, "Adam beta1.", REF(optimizer.beta1)));
  s.push_back(number("optimizer.beta2", 0, 0.999999999, kFixed, "Adam beta2.", REF(optimizer.beta2)));
  s.push_back(number("optimizer.eps", 0, 1, kFixed, "Adam epsilon.", REF(optimizer.eps)));
  s.push_back(number("optimizer.weight_decay", 0, 10, LiveEffect::Optimizer, "Decoupled weight decay.", REF(optimizer.weight_decay)));
  s.push_back(number("optimizer.grad_clip", 0, 1e9, LiveEffect::EachStep, "Global gradient-norm clip; 0: off.",
                     REF(optimizer.grad_clip)));
  s.push_back(number("optimizer.lr_scale", 0, 1e3, LiveEffect::EachStep,
                     "Multiplies the scheduled learning rate (live changes and anomaly policies use it).",
                     REF(optimizer.lr_scale)));
  s.push_back(boolean("optimizer.decay_norms_and_biases", kFixed, "Apply weight decay to norms and biases too.",
                      REF(optimizer.decay_norms_and_biases)));
  s.push_back(boolean("optimizer.decay_embeddings", kFixed, "Apply weight decay to embeddings too.",
                      REF(optimizer.decay_embeddings)));
}

void add_schedule_checkpoint_and_eval_fields(std::vector<FieldSpec>& s) {
  // Schedule.
  s.push_back(integer("schedule.steps", 1, 1e12, kFixed, "Optimizer steps of the run.", REF(schedule.steps)));
  s.push_back(integer("schedule.warmup_steps", 0, 1e12, kFixed, "Linear warm-up steps.", REF(schedule.warmup_steps)));
  s.push_back(choice<DecayKind>("schedule.decay",
                                {{"constant", DecayKind::Constant},
                                 {"cosine", DecayKind::Cosine},
                                 {"linear", DecayKind::Linear},
                                 {"lua", DecayKind::Lua}},
                                kFixed, "Decay after warm-up; \"lua\" when schedule.lr is a function of the step.",
                                REF(schedule.decay)));
  s.push_back(number("schedule.min_lr", 0, 10, kFixed, "Learning rate at the end of the decay.", REF(schedule.min_lr)));
  // Precision, checkpoints, evaluation.
  s.push_back(choice<DType>(
      "precision.compute", compute_dtypes(), kFixed,
      "Compute dtype. bf16: matmuls, attention and the residual stream in bf16 from a copy of the weights cast once "
      "per step; weights, optimizer state, gradients, norm statistics and loss stay fp32. fp16: the same in fp16, "
      "with the loss scaled (precision.loss_scale), for GPUs without bf16. auto: bf16 on CUDA, fp32 on the CPU, "
      "also one with bf16 instructions, where the run log says bf16 would train faster (the run's config.json "
      "records which).",
      REF(precision.compute)));
  s.push_back(number("precision.loss_scale", 0, 1e30, kFixed,
                     "fp16: a fixed loss scale; 0: dynamic (halved when the gradients overflow, which skips that "
                     "update, doubled after precision.loss_scale_window steps without an overflow).",
                     REF(precision.loss_scale)));
  s.push_back(number("precision.initial_loss_scale", 1, 1e30, kFixed, "fp16, dynamic: the loss scale to start from.",
                     REF(precision.initial_loss_scale)));
  s.push_back(integer("precision.loss_scale_window", 1, 1e9, kFixed,
                      "fp16, dynamic: steps without an overflow before the loss scale doubles.",
                      REF(precision.loss_scale_window)));
  s.push_back(integer("checkpoint.every", 0, 1e12, LiveEffect::EachStep,
                      "Steps between checkpoints (run-dir/checkpoints/step-N); 0: at the end only.",
                      REF(checkpoint.every)));
  s.push_back(integer("checkpoint.keep_last", 1, 1e6, kFixed, "Checkpoints kept (the most recent).",
                      REF(checkpoint.keep_last)));
  s.push_back(integer("checkpoint.keep_every", 0, 1e12, kFixed,
                      "Also keep checkpoints whose step is a multiple of this; 0: none.", REF(checkpoint.keep_every)));
  s.push_back(boolean("checkpoint.async", kFixed,
                      "Snapshot to host memory and write in the background; false: training waits for the write.",
                      REF(checkpoint.async)));
  s.push_back(integer("checkpoint.writers", 0, 64, kFixed,
                      "Files each rank writes side by side, one thread each; 0: one per 64 MiB of its share, up to 4.",
                      REF(checkpoint.writers)));
  s.push_back(string("checkpoint.init_from", kFixed,
                     "Weights the run starts from instead of its random initialisation (fine-tuning, continued "
                     "pretraining): a Hugging Face directory (config.json + safetensors), a finished run's "
                     "directory or a weights file tide wrote; the model fields must describe the same "
                     "architecture. Any layout reads them. A resumed run continues from its checkpoint instead.",
                     REF(checkpoint.init_from)));
  s.push_back(integer("eval.every", 0, 1e12, LiveEffect::EachStep, "Steps between validation passes; 0: never.", REF(eval.every)));
  s.push_back(integer("eval.batches", 1, 1e6, LiveEffect::EachStep, "Micro-batches per validation pass.", REF(eval.batches)));
}

void add_profile_fields(std::vector<FieldSpec>& s) {
  s.push_back(
      integer("profile.start_step", 0, 1e12, LiveEffect::EachStep,
              "First step that LibTorch's profiler records (1: the run's first), into run-dir/profile: a "
              "Chrome trace and a summary per recording rank; 0: none. Set live to a step already begun: from the next "
              "step.",
              REF(profile.start_step)));
  s.push_back(integer("profile.steps", 1, 100, LiveEffect::EachStep, "Steps recorded from profile.start_step on.",
                      REF(profile.steps)));
  s.push_back(int_list("profile.ranks", 0, 1e6, "Global ranks that record; empty: every rank.", REF(profile.ranks)));
  s.push_back(
      boolean("profile.shapes", kFixed, "Record each operator's input shapes in the trace.", REF(profile.shapes)));
  s.push_back(boolean("profile.memory", kFixed, "Record allocations and frees in the trace (memory over time).",
                      REF(profile.memory)));
}

void add_anomaly_and_supervision_fields(std::vector<FieldSpec>& s) {
  // Anomalies and what they trigger.
  const auto& actions = anomaly_actions();
  const std::string what =
      ": none (report only), skip (drop the update), rollback (reload the latest checkpoint, keep the data moving "
      "on), scale_lr (skip, and multiply optimizer.lr_scale by anomaly.lr_factor) or stop.";
  s.push_back(choice<AnomalyAction>("anomaly.on_nonfinite", actions, LiveEffect::Anomaly, "A NaN or Inf loss or gradient norm" + what,
                                    REF(anomaly.on_nonfinite)));
  s.push_back(choice<AnomalyAction>("anomaly.on_loss_spike", actions, LiveEffect::Anomaly,
                                    "A loss above the window's median by anomaly.spike_z robust deviations" + what,
                                    REF(anomaly.on_loss_spike)));
  s.push_back(choice<AnomalyAction>("anomaly.on_grad_explosion", actions, LiveEffect::Anomaly,
                                    "A gradient norm above anomaly.explosion_factor x the window's median" + what,
                                    REF(anomaly.on_grad_explosion)));
  s.push_back(integer("anomaly.window", 8, 100000, LiveEffect::Anomaly, "Recent normal steps the verdicts compare against.",
                      REF(anomaly.window)));
  s.push_back(number("anomaly.spike_z", 1, 1e6, LiveEffect::Anomaly, "Robust z-score (median, 1.4826 x MAD) of a loss spike.",
                     REF(anomaly.spike_z)));
  s.push_back(number("anomaly.explosion_factor", 1, 1e9, LiveEffect::Anomaly,
                     "A gradient norm above this multiple of the window's median explodes.",
                     REF(anomaly.explosion_factor)));
  s.push_back(number("anomaly.lr_factor", 0, 1, LiveEffect::Anomaly, "What scale_lr multiplies optimizer.lr_scale by.",
                     REF(anomaly.lr_factor)));
  // Supervision under tided.
  s.push_back(integer("supervise.max_restarts", 0, 1000, kFixed,
                      "Restarts from the latest checkpoint after a worker crashes or hangs, before the run fails.",
                      REF(supervise.max_restarts)));
  s.push_back(number("supervise.heartbeat_timeout_s", 1, 86400, kFixed,
                     "A worker silent this long is declared hung and its group restarted.",
                     REF(supervise.heartbeat_timeout_s)));
  s.push_back(url_list("alerts.webhooks", 8,
                       "Under tided: http(s) URLs that this run's alerts (anomaly actions, faults, failure, failed "
                       "checkpoints, stalls) are posted to as JSON, besides tided's own --alert-webhook receivers.",
                       REF(alerts.webhooks)));
}

void add_parallel_fields(std::vector<FieldSpec>& s) {
  // Parallel layout (parsed and validated now; used by the parallel engine).
  s.push_back(
      integer("parallel.dp", 0, 1e6, kFixed, "Data-parallel degree; 0: world / (cp * tp * pp).", REF(parallel.dp)));
  s.push_back(integer("parallel.tp", 1, 1e4, kFixed, "Tensor-parallel degree.", REF(parallel.tp)));
  s.push_back(integer("parallel.pp", 1, 1e4, kFixed, "Pipeline-parallel degree.", REF(parallel.pp)));
  s.push_back(integer("parallel.cp", 1, 1e4, kFixed,
                      "Context-parallel degree: each sequence is split over cp ranks (2 cp chunks, rank r holding "
                      "chunks r and 2 cp - 1 - r), joined in attention as parallel.cp_comm says; activation memory "
                      "per rank falls by cp. data.seq_len must divide into 2 cp chunks.",
                      REF(parallel.cp)));
  s.push_back(choice<std::string>(
      "parallel.cp_comm", {{"all_gather", "all_gather"}, {"all_to_all", "all_to_all"}}, kFixed,
      "How context-parallel attention reaches the other ranks' tokens: all_gather (each rank gathers every "
      "rank's keys and values: 2 K L Hd (cp - 1) values a layer) or all_to_all (DeepSpeed-Ulysses: heads "
      "exchanged for tokens, attention over the whole sequence for 1 / cp of the heads: 2 (H + K) L Hd (cp - 1) "
      "/ cp values, whatever cp). all_to_all needs the heads (per tensor-parallel rank) divisible by cp, and the "
      "key/value heads too or cp by them.",
      REF(parallel.cp_comm)));
  s.push_back(integer("parallel.ep", 1, 1e4, kFixed,
                      "Expert-parallel degree (model.moe_experts): each block's experts are spread over ep "
                      "consecutive data-parallel ranks (moe_experts / ep each), every token sent to the ranks of its "
                      "experts and its outputs back (two all-to-alls a block, each way); the dp / ep ranks that hold "
                      "the same experts reduce their gradients and share ZeRO's shards of them. Must divide dp and "
                      "model.moe_experts.",
                      REF(parallel.ep)));
  s.push_back(integer("parallel.zero", 0, 3, kFixed, "ZeRO stage on the data-parallel axis.", REF(parallel.zero)));
  s.push_back(boolean("parallel.auto", kFixed,
                      "Let the planner choose the layout and micro-batch for the ranks the run gets (as `tide "
                      "plan` ranks them; the choice and the runner-up are logged). The global batch stays.",
                      REF(parallel.auto_layout)));
  s.push_back(boolean("parallel.offload_optimizer", kFixed, "Keep optimizer state in host memory.",
                      REF(parallel.offload_optimizer)));
  s.push_back(integer("parallel.micro_batches", 0, 1e6, kFixed,
                      "Micro-batches per step on each data-parallel rank; sets the micro-batch to global_batch / "
                      "(dp * this). 0: batch.micro_batch decides.",
                      REF(parallel.micro_batches)));
  s.push_back(int_list("parallel.pipeline_stages", 1, 1e4,
                       "Blocks of each pipeline stage, first to last (e.g. {3, 3, 2}); with virtual stages, of each "
                       "of the pp x virtual_stages chunks in model order; empty: balanced by cost.",
                       REF(parallel.pipeline_stages)));
  s.push_back(choice<std::string>("parallel.pipeline_schedule", {{"1f1b", "1f1b"}, {"gpipe", "gpipe"}}, kFixed,
                                  "Pipeline schedule.", REF(parallel.pipeline_schedule)));
  s.push_back(integer("parallel.virtual_stages", 1, 1e4, kFixed,
                      "Chunks of blocks each pipeline rank holds (rank r runs chunks r, r + pp, ...): above 1, "
                      "interleaved 1F1B, whose bubble is 1 / virtual_stages of 1F1B's, for as many times the "
                      "point-to-point messages. Needs pp > 1, the 1f1b schedule and micro-batches a multiple of pp.",
                      REF(parallel.virtual_stages)));
  s.push_back(number("parallel.bucket_mb", 0.01, 1e6, kFixed, "Gradient bucket size (MiB).", REF(parallel.bucket_mb)));
  s.push_back(boolean("parallel.sequence_parallel", kFixed, "Shard norms and dropout along the sequence (tp > 1).",
                      REF(parallel.sequence_parallel)));
  s.push_back(number("parallel.timeout_s", 1, 86400, kFixed,
                     "Seconds a collective or the rendezvous may take before the job fails, naming it.",
                     REF(parallel.timeout_s)));
  s.push_back(number("parallel.node_timeout_s", 0, 86400, kFixed,
                     "Seconds without a heartbeat from a rank (one a second, through the rendezvous store) before "
                     "the other ranks declare its host lost, name it and end; 0: never (a blocked collective still "
                     "fails after parallel.timeout_s).",
                     REF(parallel.node_timeout_s)));
  s.push_back(choice<std::string>("parallel.backend", {{"auto", "auto"}, {"gloo", "gloo"}}, kFixed,
                                  "Collectives: auto (NCCL between CUDA ranks, Gloo between CPU ranks) or gloo on "
                                  "either device (CUDA tensors through host memory; ranks may then share a GPU).",
                                  REF(parallel.backend)));
}

std::vector<FieldSpec> build_schema() {
  std::vector<FieldSpec> s;
  for (auto add :
       {add_top_level_fields, add_model_fields, add_batch_and_optimizer_fields, add_schedule_checkpoint_and_eval_fields,
        add_profile_fields, add_anomaly_and_supervision_fields, add_parallel_fields})
    add(s);
  return s;
}

#undef REF

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1u : 0u)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& path) {
  const FieldSpec* best = nullptr;
  size_t best_d = 4;
  for (const auto& f : config_schema()) {
    const size_t d = edit_distance(path, f.path);
    if (d < best_d) best_d = d, best = &f;
  }
  return best ? fmt::format(" (did you mean '{}'?)", best->path) : "";
}

bool is_section(const std::string& prefix) {
  for (const auto& f : config_schema())
    if (f.path.rfind(prefix + ".", 0) == 0) return true;
  return false;
}

void apply_object(RunConfig& c, const json& j, const std::string& prefix) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (const FieldSpec* f = find_field(path)) {
      f->set(c, it.value());
    } else if (is_section(path)) {
      if (!it.value().is_object())
        throw ConfigError(path, fmt::format("expected a table of fields, got {}", show(it.value())));
      apply_object(c, it.value(), path);
    } else {
      throw ConfigError(path, "unknown field" + suggestion(path));
    }
  }
}

}  // namespace

const char* dtype_name(DType d) {
  for (const auto& [name, dtype] : compute_dtypes())
    if (dtype == d) return name.c_str();
  return "auto";
}

const char* anomaly_action_name(AnomalyAction a) {
  for (const auto& [name, action] : anomaly_actions())
    if (action == a) return name.c_str();
  return "none";
}

AnomalyAction parse_anomaly_action(const std::string& name, const std::string& field) {
  std::string names;
  for (const auto& [n, action] : anomaly_actions()) {
    if (n == name) return action;
    names += (names.empty() ? "" : ", ") + n;
  }
  throw ConfigError(field, fmt::format("'{}' is not an action ({})", name, names));
}

const std::vector<FieldSpec>& config_schema() {
  static const std::vector<FieldSpec> schema = build_schema();
  return schema;
}

const FieldSpec* find_field(const std::string& path) {
  for (const auto& f : config_schema())
    if (f.path == path) return &f;
  return nullptr;
}

RunConfig config_from_json(const json& j) {
  if (!j.is_object()) throw ConfigError("", fmt::format("a recipe must be a table, got {}", show(j)));
  RunConfig c;
  apply_object(c, j, "");
  validate(c);
  return c;
}

json config_to_json(const RunConfig& c) {
  json out = json::object();
  for (const auto& f : config_schema()) out[json::json_pointer("/" + [&] {
    std::string p = f.path;
    std::replace(p.begin(), p.end(), '.', '/');
    return p;
  }())] = f.get(c);
  return out;
}

void apply_override(json& j, const std::string& assignment) {
  // Checked first: the messages below quote it, and they travel as JSON.
  if (const size_t bad = first_non_utf8(assignment); bad != std::string::npos)
    throw ConfigError("", fmt::format("an override is not UTF-8 text (byte 0x{:02X} at offset {})",
                                      static_cast<unsigned char>(assignment[bad]), bad));
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("", fmt::format("override '{}' is not of the form key=value", assignment));
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  if (!find_field(path)) throw ConfigError(path, "unknown field" + suggestion(path));
  json value = parse_json_or_discard(text);
  if (value.is_discarded()) value = text;
  json* node = &j;
  std::stringstream parts(path);
  std::string part;
  std::vector<std::string> keys;
  while (std::getline(parts, part, '.')) keys.push_back(part);
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    json& next = (*node)[keys[i]];
    if (next.is_null()) next = json::object();
    // The recipe may hold a list or a value where the override needs a table.
    if (!next.is_object())
      throw ConfigError(path, fmt::format("the recipe's {} is {}, not a table", keys[i], show(next)));
    node = &next;
  }
  (*node)[keys.back()] = value;
}

ModelConfig model_config_from_json(const json& model) {
  if (!model.is_object()) throw ConfigError("model", fmt::format("expected a table of fields, got {}", show(model)));
  RunConfig c;
  apply_object(c, json{{"model", model}}, "");
  validate_model(c.model);
  return c.model;
}

void validate_model(const ModelConfig& m) {
  auto fail = [](const std::string& field, const std::string& msg) { throw ConfigError(field, msg); };
  if (m.head_dim == 0 && m.dim % m.n_heads != 0)
    fail("model.n_heads", fmt::format("{} does not divide model.dim = {} (or set model.head_dim)", m.n_heads, m.dim));
  if (m.family == Family::BLOOM && m.head_dim > 0 && m.head_dim * m.n_heads != m.dim)
    fail("model.head_dim", fmt::format("{} times model.n_heads = {} is not model.dim = {}: the bloom family's fused "
                                       "QKV layout has heads of dim / n_heads",
                                       m.head_dim, m.n_heads, m.dim));
  const int64_t kv = resolved_kv_heads(m);
  if (m.n_heads % kv != 0)
    fail("model.n_kv_heads", fmt::format("{} does not divide model.n_heads = {}", kv, m.n_heads));
  if (m.positions == PositionKind::RoPE && head_dim(m) % 2 != 0)
    fail("model.positions", fmt::format("RoPE needs an even head dimension, {} = {}",
                                        m.head_dim > 0 ? "model.head_dim" : "model.dim / model.n_heads", head_dim(m)));
  // A learned position table is a parameter: one that outweighs the rest of the model is
  // a typo (1e7 for 1e3) that would allocate gigabytes, not a design.
  if (m.positions == PositionKind::Learned) {
    const int64_t table = m.max_seq_len * m.dim, rest = parameter_count(m) - table;
    if (table > rest)
      fail("model.max_seq_len",
           fmt::format("{} makes the learned position table ({} x {} = {} parameters) larger than the rest of the "
                       "model ({}); lower it to the longest sequence the model will see",
                       m.max_seq_len, m.max_seq_len, m.dim, table, rest));
  }
  if (m.qk_norm && m.family == Family::BLOOM) fail("model.qk_norm", "the bloom family has no query/key norms");
  if (m.qkv_bias && m.family == Family::BLOOM)
    fail("model.qkv_bias", "the bloom family's fused QKV projection takes its biases from model.attention_bias");
  if (m.rope_scaling != RopeScaling::None && m.positions != PositionKind::RoPE)
    fail("model.rope_scaling", "scales RoPE's frequencies, and model.positions is not rope");
  if (m.rope_scaling == RopeScaling::Llama3 && !(m.rope_low_freq_factor < m.rope_high_freq_factor))
    fail("model.rope_high_freq_factor",
         fmt::format("{} is not above model.rope_low_freq_factor = {}: llama3 scaling blends between them",
                     m.rope_high_freq_factor, m.rope_low_freq_factor));
  // YaRN finds its ramp's dimensions through ln(rope_theta).
  if (m.rope_scaling == RopeScaling::Yarn && m.rope_theta <= 1)
    fail("model.rope_theta",
         fmt::format("{} leaves yarn scaling no dimensions to ramp between: it needs a base above 1", m.rope_theta));
  if (m.rope_scaling == RopeScaling::Yarn && !(m.rope_beta_slow < m.rope_beta_fast))
    fail("model.rope_beta_fast",
         fmt::format("{} is not above model.rope_beta_slow = {}: yarn scaling ramps between them", m.rope_beta_fast,
                     m.rope_beta_slow));
  if (!m.full_attention_layers.empty() && m.sliding_window == 0)
    fail("model.full_attention_layers",
         fmt::format("{} attend in full despite a sliding window, and model.sliding_window is 0",
                     json(m.full_attention_layers).dump()));
  for (size_t i = 0; i < m.full_attention_layers.size(); ++i) {
    const int64_t layer = m.full_attention_layers[i];
    const std::string field = fmt::format("model.full_attention_layers[{}]", i + 1);
    if (layer >= m.n_layers)
      fail(field, fmt::format("{} is not a layer of model.n_layers = {} (layers count from 0)", layer, m.n_layers));
    for (size_t j = 0; j < i; ++j)
      if (m.full_attention_layers[j] == layer)
        fail(field, fmt::format("{} is model.full_attention_layers[{}] too", layer, j + 1));
  }
  if (m.rope_local_theta > 0 && (m.positions != PositionKind::RoPE || m.sliding_window == 0))
    fail(
        "model.rope_local_theta",
        fmt::format("{} is the RoPE base of the layers attending over model.sliding_window, and {}", m.rope_local_theta,
                    m.positions != PositionKind::RoPE ? "model.positions is not rope" : "model.sliding_window is 0"));
  if (m.moe_experts > 0 && m.moe_top_k > m.moe_experts)
    fail("model.moe_top_k",
         fmt::format("{} experts a token is more than model.moe_experts = {}", m.moe_top_k, m.moe_experts));
  if (m.moe_experts == 0 && m.moe_shared_ffn_dim > 0)
    fail(
        "model.moe_shared_ffn_dim",
        fmt::format("{}: a shared expert stands beside routed ones, and model.moe_experts is 0", m.moe_shared_ffn_dim));
  if (m.moe_shared_gate && m.moe_shared_ffn_dim == 0)
    fail("model.moe_shared_gate", "true gates a shared expert, and model.moe_shared_ffn_dim is 0");
  if (m.moe_expert_bias && m.moe_experts == 0)
    fail("model.moe_expert_bias", "true biases the choice of experts, and model.moe_experts is 0");
  if (m.moe_capacity_factor > 0 && m.moe_experts == 0)
    fail("model.moe_capacity_factor",
         fmt::format("{} caps each expert's tokens, and model.moe_experts is 0", m.moe_capacity_factor));
  if (m.moe_groups > 1) {
    if (m.moe_experts == 0)
      fail("model.moe_groups", fmt::format("{} groups of experts, and model.moe_experts is 0", m.moe_groups));
    if (m.moe_experts % m.moe_groups != 0)
      fail("model.moe_groups",
           fmt::format("{} groups do not divide model.moe_experts = {}", m.moe_groups, m.moe_experts));
    if (m.moe_group_top_k > m.moe_groups)
      fail("model.moe_group_top_k",
           fmt::format("{} groups a token is more than model.moe_groups = {}", m.moe_group_top_k, m.moe_groups));
    if (m.moe_top_k % m.moe_group_top_k != 0)
      fail("model.moe_group_top_k", fmt::format("{} groups do not divide model.moe_top_k = {} (each group is scored by "
                                                "its top moe_top_k / moe_group_top_k)",
                                                m.moe_group_top_k, m.moe_top_k));
    if (m.moe_top_k > m.moe_group_top_k * (m.moe_experts / m.moe_groups))
      fail("model.moe_group_top_k", fmt::format("{} groups of {} experts hold fewer than model.moe_top_k = {}",
                                                m.moe_group_top_k, m.moe_experts / m.moe_groups, m.moe_top_k));
  }
  if (m.moe_experts > 0 && m.family == Family::BLOOM)
    fail("model.moe_experts",
         fmt::format("{} experts: the bloom family has no mixture-of-experts form", m.moe_experts));
  if (m.moe_experts > 0 && m.lora_rank > 0)
    fail("model.lora_rank",
         fmt::format("{}: LoRA adapters on a mixture of experts (model.moe_experts = {}) are not supported",
                     m.lora_rank, m.moe_experts));
  if (m.recompute_blocks > 0 && !m.activation_checkpointing)
    fail("model.recompute_blocks",
         fmt::format("{} blocks to recompute need model.activation_checkpointing = true", m.recompute_blocks));
  if (!m.lora_targets.empty() && m.lora_rank == 0)
    fail("model.lora_targets",
         fmt::format("{} take LoRA adapters, and model.lora_rank is 0", json(m.lora_targets).dump()));
  if (m.lora_dropout > 0 && m.lora_rank == 0)
    fail("model.lora_dropout", fmt::format("{} drops LoRA adapters' inputs, and model.lora_rank is 0", m.lora_dropout));
  if (m.lora_dropout >= 1)
    fail("model.lora_dropout",
         fmt::format("{} would drop every input of the adapters: it must be below 1", m.lora_dropout));
  const auto projections = block_projection_names(m);
  for (size_t i = 0; i < m.lora_targets.size(); ++i)
    if (std::find(projections.begin(), projections.end(), m.lora_targets[i]) == projections.end())
      fail(fmt::format("model.lora_targets[{}]", i + 1),
           fmt::format("{} is no projection of this model's blocks ({})", json(m.lora_targets[i]).dump(),
                       fmt::join(projections, ", ")));
  if (m.family == Family::BLOOM && kv != m.n_heads)
    fail("model.n_kv_heads", fmt::format("the bloom family has a fused per-head QKV layout and needs n_kv_heads = "
                                         "n_heads = {}, got {}",
                                         m.n_heads, kv));
}

void validate(const RunConfig& c) {
  const auto& m = c.model;
  auto fail = [](const std::string& field, const std::string& msg) { throw ConfigError(field, msg); };
  // The name becomes a directory (runs/<name>) and part of run ids and event topics.
  if (!is_plain_name(c.name)) fail("name", fmt::format("{} may hold only {}", json(c.name).dump(), kPlainNameRule));
  validate_model(m);
  if (!c.data.blend.empty() && !c.data.path.empty())
    fail("data.blend", fmt::format("is set and so is data.path = {}: set one of them", json(c.data.path).dump()));
  const auto sources = data_sources(c.data);
  for (size_t i = 0; i < sources.size(); ++i) {
    // A label of the validation losses (metrics, TensorBoard tags).
    if (!c.data.blend.empty() && !is_plain_name(sources[i].name))
      fail(fmt::format("data.blend[{}].name", i + 1),
           fmt::format("the directory's name {} may not be a label: give a name of {}", json(sources[i].name).dump(),
                       kPlainNameRule));
    for (size_t j = 0; j < i; ++j)
      if (sources[j].name == sources[i].name)
        fail(fmt::format("data.blend[{}].name", i + 1),
             fmt::format("{} is data.blend[{}]'s name too: give each dataset a name of its own",
                         json(sources[i].name).dump(), j + 1));
  }
  if (c.data.seq_len > m.max_seq_len)
    fail("data.seq_len", fmt::format("{} exceeds model.max_seq_len = {}", c.data.seq_len, m.max_seq_len));
  // Without the world size, a dp of 0 (inferred) is checked as 1; the launcher checks
  // the rest (check_supported_layout).
  if (c.parallel.micro_batches == 0)
    check_global_batch(c.batch.global_batch, {std::max<int64_t>(c.parallel.dp, 1), c.batch.micro_batch});
  if (c.schedule.warmup_steps > c.schedule.steps)
    fail("schedule.warmup_steps",
         fmt::format("{} exceeds schedule.steps = {}", c.schedule.warmup_steps, c.schedule.steps));
  if (c.schedule.min_lr > c.optimizer.lr)
    fail("schedule.min_lr", fmt::format("{} exceeds optimizer.lr = {}", c.schedule.min_lr, c.optimizer.lr));
  if (m.n_heads % c.parallel.tp != 0)
    fail("parallel.tp", fmt::format("{} does not divide model.n_heads = {}", c.parallel.tp, m.n_heads));
  if (c.parallel.pp > m.n_layers)
    fail("parallel.pp", fmt::format("{} exceeds model.n_layers = {}", c.parallel.pp, m.n_layers));
  check_context_parallel(c, c.parallel.cp);
  // An inferred dp (0) is checked against ep at launch.
  check_expert_parallel(c, c.parallel.dp > 0 ? c.parallel.dp : c.parallel.ep);
}

std::vector<DataSource> data_sources(const DataConfig& d) {
  std::vector<DataSource> out = d.blend;
  if (out.empty()) out.push_back({d.path, 1.0, ""});
  for (auto& s : out) {
    if (!s.name.empty()) continue;
    std::string dir = s.path;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    s.name = dir.substr(dir.rfind('/') == std::string::npos ? 0 : dir.rfind('/') + 1);
  }
  return out;
}

std::string schema_markdown() {
  std::string out = "| field | type | default | live | description |\n|---|---|---|---|---|\n";
  const RunConfig defaults;
  for (const auto& f : config_schema()) {
    std::string type;
    switch (f.type) {
      case FieldType::Int: type = fmt::format("integer [{}, {}]", f.min, f.max); break;
      case FieldType::Number: type = fmt::format("number [{}, {}]", f.min, f.max); break;
      case FieldType::Bool: type = "boolean"; break;
      case FieldType::String: type = "string"; break;
      case FieldType::Choice: type = fmt::format("{}", fmt::join(f.choices, " \\| ")); break;
      case FieldType::IntList: type = fmt::format("list of integers [{}, {}]", f.min, f.max); break;
      case FieldType::UrlList: type = fmt::format("list of http(s) URLs (at most {})", f.max); break;
      case FieldType::ChoiceList: type = fmt::format("list of {}", fmt::join(f.choices, " \\| ")); break;
      case FieldType::SourceList:
        type = fmt::format("list of {{path, weight, name}} tables (at most {})", f.max);
        break;
    }
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", f.path, type, f.get(defaults).dump(), f.live != LiveEffect::None ? "yes" : "",
                       f.doc);
  }
  return out;
}

}  // namespace tide
