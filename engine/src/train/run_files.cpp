#include "tide/engine/train/run_files.h"

#include <filesystem>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "tide/engine/config_schema.h"
#include "tide/engine/data/chat_template.h"
#include "tide/engine/model/hf_convert.h"
#include "tide/engine/model/weights_io.h"

namespace tide {
namespace fs = std::filesystem;

void copy_tokenizer(const std::string& tokenizer_path, const fs::path& dir) {
  if (tokenizer_path.empty()) return;
  fs::copy_file(tokenizer_path, dir / fs::path(tokenizer_path).filename(), fs::copy_options::overwrite_existing);
  const fs::path chat_template = fs::path(tokenizer_path).parent_path() / kChatTemplateFile;
  if (fs::exists(chat_template))
    fs::copy_file(chat_template, dir / kChatTemplateFile, fs::copy_options::overwrite_existing);
}

std::map<std::string, std::string> weights_metadata(const ModelConfig& model) {
  RunConfig rc;
  rc.model = model;
  return {{"format", "pt"}, {"tide_model", config_to_json(rc)["model"].dump()}};
}

void save_model(const std::string& path, Transformer& model) {
  save_weights(path, *model, weights_metadata(model->config()));
}

std::vector<TensorShape> parameter_shapes(const ModelConfig& m) {
  Transformer shapes(m, TensorParallel{}, PipelineStage{}, ParameterStorage::Deferred);
  std::vector<TensorShape> out;
  for (const auto& [name, t] : weight_tensors(*shapes)) out.push_back({name, t.sizes().vec()});
  return out;
}

void convert_weights(const std::string& from, const std::string& out, bool hf_dir, int64_t max_shard_bytes,
                     const std::string& dtype) {
  const ModelWeights weights = find_model_weights(from);
  const WeightFiles files(weights.files, weights.parameter_name, from);
  const auto tensors = parameter_shapes(weights.config);
  // The files hold the model of their config, every parameter once: checked before a byte
  // is written (the shapes as each is read).
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& t : tensors) {
    if (!files.holds(t.name))
      throw std::runtime_error(fmt::format("{} holds no tensor for parameter '{}'", from, t.name));
    shapes[t.name] = t.shape;
  }
  for (const auto& name : files.names())
    if (!shapes.count(name))
      throw std::runtime_error(fmt::format("{}: tensor '{}' has no parameter in the model of its config", from, name));
  const TensorSource source = [&](const std::string& name) { return files.read(name, shapes.at(name)); };
  if (hf_dir) {
    export_hf(out, weights.config, tensors, source, max_shard_bytes, dtype, weights.tokenizer_path);
  } else {
    fs::create_directories(out);
    stream_weights((fs::path(out) / "model.safetensors").string(), tensors, source, weights_metadata(weights.config),
                   dtype);
    copy_tokenizer(weights.tokenizer_path, out);
  }
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
