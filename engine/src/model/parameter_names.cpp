#include "tide/engine/model/parameter_names.h"

#include <cctype>
#include <cstdlib>
#include <string>

namespace tide {

int block_unit(const std::string& name) {
  for (const char* marker : {".layers.", ".h."}) {
    const auto at = name.find(marker);
    if (at == std::string::npos) continue;
    const char* digits = name.c_str() + at + std::char_traits<char>::length(marker);
    char* end = nullptr;
    const long index = std::strtol(digits, &end, 10);
    if (end != digits && *end == '.') return 1 + static_cast<int>(index);
  }
  return 0;
}

bool is_head_parameter(const std::string& name) {
  return name == "lm_head.weight" || name.rfind("model.norm.", 0) == 0 || name.rfind("transformer.ln_f.", 0) == 0;
}

bool is_expert_bias(const std::string& name) { return ends_with(name, ".mlp.expert_bias"); }

int64_t expert_index(const std::string& name) {
  static const std::string kExperts = ".mlp.experts.";
  const auto at = name.find(kExperts);
  if (at == std::string::npos) return -1;
  const size_t first = at + kExperts.size();
  size_t end = first;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == first) return -1;
  return std::stoll(name.substr(first, end - first));
}

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_lora_parameter(const std::string& name) {
  return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight");
}

std::string block_module_of(const std::string& name) {
  if (block_unit(name) == 0) return {};
  size_t end = name.rfind('.');  // before the role: ".weight", ".bias"
  if (is_lora_parameter(name)) end = name.rfind('.', end - 1);
  if (end == std::string::npos || end == 0) return {};
  const size_t first = name.rfind('.', end - 1) + 1;  // npos + 1: from the start
  return name.substr(first, end - first);
}

int ParameterUnitLayout::unit_of(const std::string& name) const {
  if (const int block = block_unit(name); block > 0) return block;
  return is_head_parameter(name) ? head() : 0;
}

ParameterUnitLayout parameter_unit_layout(const ModelConfig& m) {
  ParameterUnitLayout units;
  units.n_layers = m.n_layers;
  units.tied = m.tie_embeddings;
  units.embedding_norm = m.embedding_norm;
  return units;
}

}  // namespace tide
