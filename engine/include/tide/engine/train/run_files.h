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
#include "tide/engine/model/weights_io.h"

namespace tide {

// The model a path names (model_weights.h: find_model_weights), read.
struct LoadedModel {
  Transformer model{nullptr};
  std::string tokenizer_path;  // empty when none is beside the weights
};

LoadedModel load_model(const std::string& path);

// The tensors a weights file of a model of config `m` holds (one process's: no tensor or
// pipeline split; weight_tensors: its parameters, then its buffers), in the model's order,
// as shapes: built with no memory, so any size costs nothing.
std::vector<TensorShape> parameter_shapes(const ModelConfig& m);

// The weights at `from` (find_model_weights) written again one tensor at a time, so that a
// model larger than this host's memory converts: as a Hugging Face directory (export_hf's
// options), or as a tide weights file (`hf_dir` false: model.safetensors with the model
// in its metadata). The tokenizer beside them goes along. Throws before writing when the
// files do not hold exactly the parameters of their config's model.
void convert_weights(const std::string& from, const std::string& out, bool hf_dir, int64_t max_shard_bytes = 0,
                     const std::string& dtype = "F32");

// A copy of the tokenizer file into `dir` under its own name, and of the chat template
// beside it where there is one (chat_template.h), so that an exported model directory is
// whole; nothing when `tokenizer_path` is empty.
void copy_tokenizer(const std::string& tokenizer_path, const std::filesystem::path& dir);

// Writes model.safetensors with the model config in its metadata.
void save_model(const std::string& path, Transformer& model);
// That metadata: {"format": "pt", "tide_model": the model config as JSON}.
std::map<std::string, std::string> weights_metadata(const ModelConfig& model);

}  // namespace tide
