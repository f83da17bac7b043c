// Hugging Face checkpoints (config.json + model.safetensors, or shards with
// model.safetensors.index.json) of the LLaMA and BLOOM families.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/engine/model/transformer.h"

namespace tide {

// HF config.json for this model. Throws ConfigError when the model uses a part the
// family's HF architecture cannot express (say LayerNorm in a LLaMA).
nlohmann::json hf_config(const ModelConfig& m);
ModelConfig model_config_from_hf(const nlohmann::json& hf);

// Writes config.json and the weights; shards above max_shard_bytes (0: one file).
void export_hf(const std::string& dir, Transformer& model, int64_t max_shard_bytes = 0,
               const std::string& dtype = "F32");

// The safetensors files of an HF directory (one file, or those the index names).
std::vector<std::string> hf_weight_files(const std::string& dir);

// Reads config.json and weights into a new model (fp32, CPU).
Transformer import_hf(const std::string& dir);

}  // namespace tide
