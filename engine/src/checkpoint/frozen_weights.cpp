#include "frozen_weights.h"

#include <fmt/format.h>
#include <torch/types.h>
#include <xxhash.h>

#include "checkpoint_files.h"
#include "tide/engine/model/transformer.h"

namespace tide {

std::string tensor_fingerprint(const at::Tensor& whole) {
  const auto host = whole.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  return hex64(XXH3_64bits(host.data_ptr(), static_cast<size_t>(host.nbytes())));
}

WeightFingerprints weights_fingerprints(const std::vector<std::string>& names, const TensorSource& whole) {
  WeightFingerprints out;
  for (const auto& name : names) out[name] = tensor_fingerprint(whole(name));
  return out;
}

WeightFingerprints recorded_fingerprints(const nlohmann::json& manifest) {
  WeightFingerprints out;
  const auto it = manifest.find("frozen_xxh3");
  if (it == manifest.end() || !it->is_object()) return out;
  for (const auto& [name, hash] : it->items())
    if (hash.is_string()) out[name] = hash.get<std::string>();
  return out;
}

std::string fingerprint_difference(const WeightFingerprints& recorded, const WeightFingerprints& here, bool all) {
  if (recorded.empty() && !here.empty()) return "no frozen weights recorded (every weight trained)";
  if (!recorded.empty() && here.empty()) return "frozen weights recorded, and none here";
  for (const auto& [name, hash] : here) {
    const auto it = recorded.find(name);
    if (it == recorded.end()) return fmt::format("{}: not recorded", name);
    if (it->second != hash) return fmt::format("{}: XXH3 {} recorded, {} here", name, it->second, hash);
  }
  if (all)
    for (const auto& [name, hash] : recorded)
      if (!here.count(name)) return fmt::format("{}: recorded, not a frozen weight here", name);
  return "";
}

std::vector<std::string> frozen_parameter_names(const TransformerImpl& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters())
    if (!item.value().requires_grad()) out.push_back(item.key());
  return out;
}

}  // namespace tide
