#include "tide/engine/train/initial_weights.h"

#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/types.h>

#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/weights_io.h"

namespace tide {

void load_initial_weights(const std::string& path, const ModelConfig& recipe, Checkpointer& checkpointer) {
  const ModelWeights weights = check_initial_weights(path, recipe);
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> tensors;
  for (const auto& file : weights.files) {
    files.push_back(std::make_unique<SafetensorsReader>(file));
    for (const auto& e : files.back()->entries()) {
      const std::string name = weights.parameter_name(e.name);
      if (name.empty()) continue;
      if (!tensors.emplace(name, std::make_pair(files.back().get(), &e)).second)
        throw std::runtime_error(fmt::format("{}: tensor '{}' appears twice", path, e.name));
    }
  }
  size_t read = 0;
  checkpointer.initialise(
      [&](const std::string& name) {
        const auto it = tensors.find(name);
        if (it == tensors.end())
          throw std::runtime_error(fmt::format("{} holds no tensor for parameter '{}'", path, name));
        const auto& [file, entry] = it->second;
        ++read;
        return read_weight(*file, *entry, path);
      },
      path);
  spdlog::info("initialised from {}: {} of its {} tensors read on this rank", path, read, tensors.size());
}

}  // namespace tide
