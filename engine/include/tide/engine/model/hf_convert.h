// Hugging Face checkpoints (config.json + model.safetensors, or shards with
// model.safetensors.index.json) of the LLaMA and BLOOM families.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/engine/model/transformer.h"

namespace tide {

// HF config.json for this model. Throws ConfigError when the model uses a part the
// family's HF architecture cannot express (say LayerNorm in a LLaMA).
nlohmann::json hf_config(const ModelConfig& m);
// Errors name the config.json key and its value (a missing key, a string where a number
// belongs).
ModelConfig model_config_from_hf(const nlohmann::json& hf);

// Writes config.json and the weights; shards above max_shard_bytes (0: one file). With a
// tokenizer (tokenizer.json or tokenizer.model) the directory loads whole in transformers:
// the tokenizer is copied, tokenizer_config.json and generation_config.json name its
// special tokens, and config.json gets bos_token_id / eos_token_id (so `generate` stops
// at tide's end-of-text).
void export_hf(const std::string& dir, Transformer& model, int64_t max_shard_bytes = 0,
               const std::string& dtype = "F32", const std::string& tokenizer_path = "");

// The safetensors files of an HF directory (one file, or those the index names).
std::vector<std::string> hf_weight_files(const std::string& dir);

// The parameter an HF file's tensor holds ("" for none): BLOOM files saved from
// BloomModel lack the "transformer." prefix, and tied output weights are sometimes stored.
std::function<std::string(const std::string&)> hf_parameter_name(const ModelConfig& m);

// Reads config.json and weights into a new model (fp32, CPU).
Transformer import_hf(const std::string& dir);

}  // namespace tide
