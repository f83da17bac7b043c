#include "initial_weights.h"

#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/weights_io.h"
#include "tide/engine/train/run_files.h"

namespace tide {

namespace {
std::vector<std::string> architecture_differences(const ModelConfig& recipe, const ModelConfig& weights,
                                                  const std::string& path) {
  // Compared as the recipe schema writes them, sizes resolved: an explicit ffn_dim equal
  // to the derived one, or n_kv_heads = n_heads against 0, describe the same model.
  const auto fields = [](const ModelConfig& m) {
    RunConfig c;
    c.model = m;
    c.model.ffn_dim = resolved_ffn_dim(m);
    c.model.n_kv_heads = resolved_kv_heads(m);
    return config_to_json(c)["model"];
  };
  const auto a = fields(recipe), b = fields(weights);
  std::vector<std::string> keys{"family",     "vocab_size",     "dim",      "n_layers",       "n_heads",
                                "n_kv_heads", "ffn_dim",        "norm",     "norm_eps",       "positions",
                                "mlp",        "attention_bias", "mlp_bias", "embedding_norm", "tie_embeddings"};
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

void load_initial_weights(const std::string& path, const ModelConfig& recipe, Checkpointer& checkpointer) {
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
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> tensors;
  for (const auto& file : weights.files) {
    files.push_back(std::make_unique<SafetensorsReader>(file));
    for (const auto& e : files.back()->entries()) {
      const std::string name = weights.parameter_name(e.name);
      if (name.empty()) continue;
      if (!tensors.emplace(name, std::make_pair(files.back().get(), &e)).second)
        throw std::runtime_error(fmt::format("{}: tensor '{}' appears twice", path, e.name));
    }
  }
  size_t read = 0;
  checkpointer.initialise(
      [&](const std::string& name) {
        const auto it = tensors.find(name);
        if (it == tensors.end())
          throw std::runtime_error(fmt::format("{} holds no tensor for parameter '{}'", path, name));
        const auto& [file, entry] = it->second;
        ++read;
        return read_weight(*file, *entry, path);
      },
      path);
  spdlog::info("initialised from {}: {} of its {} tensors read on this rank", path, read, tensors.size());
}

}  // namespace tide
