#include "tide/engine/model/hf_convert.h"

#include <filesystem>
#include <fstream>
#include <map>

#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <torch/types.h>

#include "tide/engine/data/chat_template.h"
#include "tide/engine/data/tokenizer.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/model/weights_io.h"

namespace tide {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
json read_json(const fs::path& p) { return read_json_file(p.string()); }

void write_json(const fs::path& p, const json& j) {
  std::ofstream out(p, std::ios::trunc);
  out << j.dump(2) << "\n";
  if (!out.flush()) throw std::runtime_error("cannot write '" + p.string() + "'");
}
}  // namespace

namespace {
// The tokenizer beside the weights, and the files that tell transformers about its
// special tokens. tide's own data has no begin-of-sequence id: GPT-2's convention
// (bos = eos = <|endoftext|>) is what transformers expects of such a tokenizer.
void export_tokenizer(const fs::path& dir, const std::string& tokenizer_path, int64_t max_seq_len, json& config) {
  const auto tok = load_tokenizer(tokenizer_path);
  fs::copy_file(tokenizer_path, dir / fs::path(tokenizer_path).filename(), fs::copy_options::overwrite_existing);
  const int32_t eos = tok->eos_id();
  const int32_t bos = tok->bos_id() >= 0 ? tok->bos_id() : eos;
  json tokenizer_config = {{"tokenizer_class", tok->file_name() == "tokenizer.model" ? "LlamaTokenizer"
                                                                                       : "PreTrainedTokenizerFast"},
                           {"model_max_length", max_seq_len},
                           {"clean_up_tokenization_spaces", false}};
  json generation = {{"_from_model_config", true}};
  if (eos >= 0) {
    config["eos_token_id"] = generation["eos_token_id"] = eos;
    tokenizer_config["eos_token"] = tok->token_text(eos);
  }
  if (bos >= 0) {
    config["bos_token_id"] = generation["bos_token_id"] = bos;
    tokenizer_config["bos_token"] = tok->token_text(bos);
  }
  if (tok->file_name() == "tokenizer.model") tokenizer_config["add_bos_token"] = tok->bos_id() >= 0;
  // The chat template the model was tuned in (chat_template.h), in both places engines
  // look: transformers >= 4.50 reads the file, older ones and vLLM's fallbacks the field.
  if (const auto chat_template = chat_template_beside(tokenizer_path)) {
    std::ofstream out(dir / kChatTemplateFile, std::ios::binary | std::ios::trunc);
    out << *chat_template;
    if (!out.flush()) throw std::runtime_error("cannot write " + (dir / kChatTemplateFile).string());
    tokenizer_config["chat_template"] = *chat_template;
  }
  write_json(dir / "tokenizer_config.json", tokenizer_config);
  write_json(dir / "generation_config.json", generation);
}
}  // namespace

void export_hf(const std::string& dir, const ModelConfig& m, const std::vector<TensorShape>& tensors,
               const TensorSource& source, int64_t max_shard_bytes, const std::string& dtype,
               const std::string& tokenizer_path) {
  fs::create_directories(dir);
  json config = hf_config(m);
  // Written under Hugging Face's names where they differ from tide's (Mixtral's experts).
  std::vector<TensorShape> named;
  std::map<std::string, std::string> tide_name;
  for (const auto& t : tensors) {
    named.push_back({hf_export_name(m, t.name), t.shape});
    tide_name[named.back().name] = t.name;
  }
  const TensorSource by_hf_name = [&](const std::string& name) { return source(tide_name.at(name)); };
  // What the weight files hold: transformers loads them as this dtype by default.
  config["torch_dtype"] = dtype == "BF16" ? "bfloat16" : dtype == "F16" ? "float16" : "float32";
  if (!tokenizer_path.empty()) export_tokenizer(dir, tokenizer_path, m.max_seq_len, config);
  write_json(fs::path(dir) / "config.json", config);
  if (max_shard_bytes <= 0) {
    stream_weights((fs::path(dir) / "model.safetensors").string(), named, by_hf_name, {{"format", "pt"}}, dtype);
    return;
  }
  // Greedy shards in parameter order, as transformers' save_pretrained does, planned from
  // the shapes: each tensor is fetched only when its shard is written.
  const auto width = static_cast<int64_t>(safetensors_dtype_size(dtype));
  std::vector<std::vector<TensorShape>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& t : named) {
    const int64_t bytes = width * c10::multiply_integers(t.shape);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes;
    total += bytes;
  }
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    stream_weights((fs::path(dir) / file).string(), shards[i], by_hf_name, {{"format", "pt"}}, dtype);
    for (const auto& t : shards[i]) weight_map[t.name] = file;
  }
  write_json(fs::path(dir) / "model.safetensors.index.json",
             {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
}

void export_hf(const std::string& dir, Transformer& model, int64_t max_shard_bytes, const std::string& dtype,
               const std::string& tokenizer_path) {
  const auto params = model->named_parameters();
  std::vector<TensorShape> tensors;
  for (const auto& item : params) tensors.push_back({item.key(), item.value().sizes().vec()});
  export_hf(
      dir, model->config(), tensors, [&](const std::string& name) { return params[name]; }, max_shard_bytes, dtype,
      tokenizer_path);
}

Transformer import_hf(const std::string& dir) {
  const json config = read_json(fs::path(dir) / "config.json");
  const ModelConfig m = model_config_from_hf(config);
  Transformer model(m);
  load_weights(hf_weight_files(dir), *model, hf_parameter_name(m, config));
  return model;
}

}  // namespace tide
