// The files of a run directory, and loading a model from anything a user may point
// at: a run directory, a weights file written by tide, or a Hugging Face directory.
//
//   <run>/config.json       the resolved run configuration
//   <run>/metrics.jsonl     one record per step (and per validation)
//   <run>/tb/               the same figures as TensorBoard event files
//   <run>/train.log         the run's log
//   <run>/model.safetensors final weights, HF names; metadata "tide_model" = model config
//   <run>/tokenizer.json    copy of the dataset's tokenizer (or tokenizer.model)
//   <run>/summary.json      final figures
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "tide/engine/model/model_weights.h"
#include "tide/engine/model/transformer.h"

namespace tide {

// The model a path names (model_weights.h: find_model_weights), read.
struct LoadedModel {
  Transformer model{nullptr};
  std::string tokenizer_path;  // empty when none is beside the weights
};

LoadedModel load_model(const std::string& path);

// A copy of the tokenizer file into `dir` under its own name, so that an exported model
// directory is whole; nothing when `tokenizer_path` is empty.
void copy_tokenizer(const std::string& tokenizer_path, const std::filesystem::path& dir);

// Writes model.safetensors with the model config in its metadata.
void save_model(const std::string& path, Transformer& model);
// That metadata: {"format": "pt", "tide_model": the model config as JSON}.
std::map<std::string, std::string> weights_metadata(const ModelConfig& model);

}  // namespace tide
