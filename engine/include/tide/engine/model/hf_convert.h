// Hugging Face checkpoints (config.json + model.safetensors, or shards with
// model.safetensors.index.json) of the LLaMA and BLOOM families.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/engine/model/hf_config.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/model/weights_io.h"

namespace tide {

// Writes config.json and the weights of a model of config `m`: `tensors` in the model's
// order, each fetched from `source` as it is written (weights_io.h: stream_weights), so
// that one parameter at a time is in memory whatever the model's size; shards above
// max_shard_bytes (0: one file), planned from the shapes. With a tokenizer
// (tokenizer.json or tokenizer.model) the directory loads whole in transformers: the
// tokenizer is copied, tokenizer_config.json and generation_config.json name its special
// tokens, and config.json gets bos_token_id / eos_token_id (so `generate` stops at tide's
// end-of-text); a chat template beside the tokenizer (chat_template.jinja) is copied and
// put in tokenizer_config.json.
void export_hf(const std::string& dir, const ModelConfig& m, const std::vector<TensorShape>& tensors,
               const TensorSource& source, int64_t max_shard_bytes = 0, const std::string& dtype = "F32",
               const std::string& tokenizer_path = "");
// The same for a model in memory.
void export_hf(const std::string& dir, Transformer& model, int64_t max_shard_bytes = 0,
               const std::string& dtype = "F32", const std::string& tokenizer_path = "");

// Reads config.json and weights into a new model (fp32, CPU).
Transformer import_hf(const std::string& dir);

}  // namespace tide
