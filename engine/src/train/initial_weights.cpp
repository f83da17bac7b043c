#include "tide/engine/train/initial_weights.h"

#include <spdlog/spdlog.h>
#include <torch/types.h>

#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/model/weights_io.h"

namespace tide {

void load_initial_weights(const std::string& path, const ModelConfig& recipe, Checkpointer& checkpointer) {
  const ModelWeights weights = check_initial_weights(path, recipe);
  const WeightFiles files(weights.files, weights.parameter_name, path);
  checkpointer.initialise([&](const std::string& name) { return files.read(name); }, path);
  spdlog::info("initialised from {}: {} of its {} tensors read on this rank", path, files.reads(), files.size());
}

}  // namespace tide
