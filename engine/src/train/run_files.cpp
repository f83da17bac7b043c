#include "tide/engine/train/run_files.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "tide/engine/config_schema.h"
#include "tide/engine/model/weights_io.h"

namespace tide {
namespace fs = std::filesystem;

void copy_tokenizer(const std::string& tokenizer_path, const fs::path& dir) {
  if (tokenizer_path.empty()) return;
  fs::copy_file(tokenizer_path, dir / fs::path(tokenizer_path).filename(), fs::copy_options::overwrite_existing);
}

std::map<std::string, std::string> weights_metadata(const ModelConfig& model) {
  RunConfig rc;
  rc.model = model;
  return {{"format", "pt"}, {"tide_model", config_to_json(rc)["model"].dump()}};
}

void save_model(const std::string& path, Transformer& model) {
  save_weights(path, *model, weights_metadata(model->config()));
}

LoadedModel load_model(const std::string& path) {
  const ModelWeights weights = find_model_weights(path);
  LoadedModel out;
  out.model = Transformer(weights.config);
  load_weights(weights.files, *out.model, weights.parameter_name);
  out.tokenizer_path = weights.tokenizer_path;
  return out;
}

}  // namespace tide
