// check_initial_weights (initial_weights.h): no LibTorch, so that tided checks a submitted
// run's checkpoint.init_from before it queues the run.
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/engine/config_schema.h"
#include "tide/engine/train/initial_weights.h"

namespace tide {

namespace {
std::vector<std::string> architecture_differences(const ModelConfig& recipe, const ModelConfig& weights,
                                                  const std::string& path) {
  // Compared as the recipe schema writes them, sizes resolved: an explicit ffn_dim or
  // head_dim equal to the derived one, or n_kv_heads = n_heads against 0, describe the
  // same model.
  const auto fields = [](const ModelConfig& m) {
    RunConfig c;
    c.model = m;
    c.model.ffn_dim = resolved_ffn_dim(m);
    c.model.n_kv_heads = resolved_kv_heads(m);
    c.model.head_dim = head_dim(m);
    return config_to_json(c)["model"];
  };
  const auto a = fields(recipe), b = fields(weights);
  std::vector<std::string> keys{
      "family",         "vocab_size",     "dim",      "n_layers",  "n_heads",    "n_kv_heads",     "head_dim",
      "ffn_dim",        "norm",           "norm_eps", "positions", "mlp",        "attention_bias", "mlp_bias",
      "embedding_norm", "tie_embeddings", "qkv_bias", "qk_norm",   "moe_experts"};
  if (recipe.moe_experts > 0)
    for (const char* key : {"moe_shared_ffn_dim", "moe_shared_gate", "moe_router"}) keys.emplace_back(key);
  // Weights without routing biases start a run that has them at 0; weights with them
  // route otherwise without them.
  if (weights.moe_expert_bias) keys.emplace_back("moe_expert_bias");
  if (recipe.positions == PositionKind::RoPE) keys.emplace_back("rope_theta");
  if (recipe.positions == PositionKind::Learned) keys.emplace_back("max_seq_len");
  std::vector<std::string> out;
  for (const auto& key : keys)
    if (a.at(key) != b.at(key))
      out.push_back(
          fmt::format("model.{} = {} in the recipe, {} in {}", key, a.at(key).dump(), b.at(key).dump(), path));
  return out;
}
}  // namespace

ModelWeights check_initial_weights(const std::string& path, const ModelConfig& recipe) {
  ModelWeights weights;
  try {
    weights = find_model_weights(path);
  } catch (const std::runtime_error& e) {
    throw ConfigError("checkpoint.init_from", e.what());
  }
  const auto differences = architecture_differences(recipe, weights.config, path);
  if (!differences.empty())
    throw ConfigError("checkpoint.init_from",
                      fmt::format("the weights do not fit the recipe's model: {}", fmt::join(differences, "; ")));
  return weights;
}

}  // namespace tide
