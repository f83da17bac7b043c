// The weights a path names, found and described without reading a tensor (no LibTorch):
// a Hugging Face directory (config.json + safetensors), a run directory that finished
// (model.safetensors), or a weights file written by tide (its metadata holds the model
// config).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tide/engine/config.h"

namespace tide {

struct ModelWeights {
  ModelConfig config;
  std::vector<std::string> files;
  // The parameter a file's tensor holds ("" for none); identity for tide's files.
  std::function<std::string(const std::string&)> parameter_name;
  std::string tokenizer_path;  // empty when none is beside the weights
};
// Throws naming the path when it holds none of those.
ModelWeights find_model_weights(const std::string& path);

// tokenizer.json or tokenizer.model in `dir`; empty when neither exists. Where both do
// (Hugging Face's Llama 2, Mistral and Gemma repositories), tokenizer.model: the
// tokenizer.json is the SentencePiece model converted (byte fallback, ▁ for spaces),
// which tide reads in its original form.
std::string tokenizer_beside(const std::filesystem::path& dir);

}  // namespace tide
