#include "tide/engine/model/model_weights.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tide/engine/checkpoint/checkpoint_index.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/hf_config.h"

namespace tide {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
ModelConfig model_from_metadata(const std::string& file) {
  const SafetensorsReader r(file);
  const auto it = r.metadata().find("tide_model");
  if (it == r.metadata().end())
    throw std::runtime_error(file + ": no 'tide_model' metadata; point at a run or Hugging Face directory instead");
  const json j = parse_json_input(it->second, file + ": 'tide_model' metadata");
  return model_config_from_json(j);
}
}  // namespace

std::string tokenizer_beside(const std::filesystem::path& dir) {
  for (const char* name : {"tokenizer.model", "tokenizer.json"})
    if (fs::exists(dir / name)) return (dir / name).string();
  return "";
}

ModelWeights find_model_weights(const std::string& path) {
  ModelWeights out;
  const fs::path p(path);
  std::string weights;
  if (fs::is_directory(p)) {
    const fs::path config = p / "config.json";
    if (fs::exists(config)) {
      const json j = read_json_file(config.string());
      if (j.is_object() && j.contains("model_type")) {
        out.config = model_config_from_hf(j);
        out.files = hf_weight_files(path);
        out.parameter_name = hf_parameter_name(out.config, j);
        out.tokenizer_path = tokenizer_beside(p);
        return out;
      }
    }
    weights = (p / "model.safetensors").string();
    if (!fs::exists(weights)) {
      // A run that was stopped (or has not ended) keeps checkpoints, not final weights.
      const auto saved = list_checkpoints((p / "checkpoints").string());
      if (saved.empty()) throw std::runtime_error("'" + path + "' holds no model.safetensors");
      throw std::runtime_error("'" + path +
                               "' holds no model.safetensors: the run has not finished; its newest "
                               "checkpoint loads once exported: tide ckpt export " +
                               saved.back().path + " -o DIR, then point at DIR");
    }
  } else if (fs::exists(p)) {
    weights = path;
  } else {
    throw std::runtime_error("'" + path + "' does not exist");
  }
  out.config = model_from_metadata(weights);
  out.files = {weights};
  out.parameter_name = [](const std::string& name) { return name; };
  out.tokenizer_path = tokenizer_beside(fs::path(weights).parent_path());
  return out;
}

}  // namespace tide
