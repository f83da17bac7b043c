// The Hugging Face description of a model (config.json) and the files and tensor names
// of a Hugging Face directory, for the LLaMA and BLOOM families (no LibTorch: tided checks
// a run's checkpoint.init_from with them).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/engine/config.h"

namespace tide {

// HF config.json for this model. Throws ConfigError when the model uses a part the
// family's HF architecture cannot express (say LayerNorm in a LLaMA).
nlohmann::json hf_config(const ModelConfig& m);
// Errors name the config.json key and its value (a missing key, a string where a number
// belongs). A multimodal Gemma 3's (model_type gemma3) is its text_config's language model.
ModelConfig model_config_from_hf(const nlohmann::json& hf);

// The safetensors files of an HF directory (one file, or those the index names).
std::vector<std::string> hf_weight_files(const std::string& dir);

// The parameter an HF file's tensor holds ("" for none), for the model `config` (the
// directory's config.json) describes: BLOOM files saved from BloomModel lack the
// "transformer." prefix, tied output weights are sometimes stored, and a multimodal
// Gemma 3 (Gemma3ForConditionalGeneration: 4B and larger) keeps its language model under
// "language_model." beside a vision tower and projector, which tide leaves out.
std::function<std::string(const std::string&)> hf_parameter_name(const ModelConfig& m, const nlohmann::json& config);
// The name an export writes tide's parameter under: tide's own, except for Mixtral (a
// mixture of experts without query/key norms), whose router and experts are
// `block_sparse_moe.gate` and `block_sparse_moe.experts.<e>.w1/w3/w2` (tide's, Qwen-MoE's:
// `mlp.gate`, `mlp.experts.<e>.gate_proj/up_proj/down_proj`).
std::string hf_export_name(const ModelConfig& m, const std::string& name);

}  // namespace tide
