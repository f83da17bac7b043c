#include "frozen_weights.h"

#include <algorithm>

#include <torch/types.h>
#include <xxhash.h>

#include "checkpoint_files.h"
#include "tide/engine/model/transformer.h"

namespace tide {

std::string weights_fingerprint(std::vector<std::string> names, const TensorSource& values) {
  if (names.empty()) return "";
  std::sort(names.begin(), names.end());
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& name : names) {
    const auto host = values(name).detach().to(torch::kCPU, torch::kFloat32).contiguous();
    XXH3_64bits_update(state, host.data_ptr(), static_cast<size_t>(host.nbytes()));
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hex64(h);
}

std::string recorded_fingerprint(const nlohmann::json& manifest) {
  const auto it = manifest.find("frozen_xxh3");
  return it != manifest.end() && it->is_string() ? it->get<std::string>() : "";
}

std::vector<std::string> frozen_parameter_names(const TransformerImpl& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters())
    if (!item.value().requires_grad()) out.push_back(item.key());
  return out;
}

}  // namespace tide
