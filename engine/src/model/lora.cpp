#include "tide/engine/model/lora.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/transformer.h"

namespace tide {

ModelConfig without_lora(const ModelConfig& m) {
  ModelConfig out = m;
  out.lora_rank = 0;
  out.lora_dropout = 0;
  out.lora_targets.clear();
  return out;
}

at::Tensor merge_lora(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, double scale) {
  torch::NoGradGuard no_grad;
  const auto w = weight.to(torch::kFloat32);
  return w.addmm(b.to(w.device(), torch::kFloat32), a.to(w.device(), torch::kFloat32), 1.0, scale);
}

TensorSource merged_weights(const ModelConfig& m, TensorSource source) {
  const auto targets = lora_target_names(m);
  const double scale = m.lora_rank > 0 ? m.lora_alpha / static_cast<double>(m.lora_rank) : 0.0;
  return [targets, scale, source = std::move(source)](const std::string& name) {
    // "....<module>.weight" of a targeted module: its adapter is "....<module>.lora_A.weight".
    const std::string suffix = ".weight";
    if (ends_with(name, suffix)) {
      const std::string module = name.substr(0, name.size() - suffix.size());
      const std::string last = module.substr(module.rfind('.') + 1);
      if (std::find(targets.begin(), targets.end(), last) != targets.end())
        return merge_lora(source(name), source(module + ".lora_A.weight"), source(module + ".lora_B.weight"), scale);
    }
    return source(name);
  };
}

void write_peft_adapter(const std::string& dir, const ModelConfig& m, const TensorSource& adapters,
                        const std::string& base, const std::string& dtype) {
  namespace fs = std::filesystem;
  TORCH_CHECK(m.lora_rank > 0, "write_peft_adapter: the model has no LoRA adapters");
  const std::string prefix = "base_model.model.";
  const Transformer shapes(m, TensorParallel{}, PipelineStage{}, ParameterStorage::Deferred);
  std::vector<TensorShape> tensors;
  for (const auto& item : shapes->named_parameters())
    if (is_lora_parameter(item.key())) tensors.push_back({prefix + item.key(), item.value().sizes().vec()});
  fs::create_directories(dir);
  stream_weights((fs::path(dir) / "adapter_model.safetensors").string(), tensors,
                 [&](const std::string& name) { return adapters(name.substr(prefix.size())); }, {{"format", "pt"}},
                 dtype);
  // PEFT's LoraConfig fields: the ones that shape the adapter, the rest its defaults.
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", m.lora_rank},
      {"lora_alpha", m.lora_alpha},
      {"target_modules", lora_target_names(m)},
      {"lora_dropout", m.lora_dropout},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"inference_mode", true},
      {"base_model_name_or_path", base.empty() ? nlohmann::json(nullptr) : nlohmann::json(base)}};
  std::ofstream out(fs::path(dir) / "adapter_config.json");
  out << config.dump(2) << "\n";
  if (!out.flush()) throw std::runtime_error("cannot write " + (fs::path(dir) / "adapter_config.json").string());
}

}  // namespace tide
