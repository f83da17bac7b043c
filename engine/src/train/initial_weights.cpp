#include "tide/engine/train/initial_weights.h"

#include <memory>
#include <stdexcept>

#include <spdlog/spdlog.h>
#include <torch/types.h>

#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/model/weights_io.h"

namespace tide {

void load_initial_weights(const std::string& path, const ModelConfig& recipe, Checkpointer& checkpointer) {
  const ModelWeights weights = check_initial_weights(path, recipe);
  const WeightFiles files(weights.files, weights.parameter_name, path);
  // Base weights hold no LoRA adapters: those keep their initial values (B = 0, no change);
  // weights of a model without routing biases (a Mixtral import) leave them at 0.
  checkpointer.initialise(
      [&](const std::string& name) {
        return (is_lora_parameter(name) || is_expert_bias(name)) && !files.holds(name) ? torch::Tensor()
                                                                                       : files.read(name);
      },
      path);
  spdlog::info("initialised from {}: {} of its {} tensors read on this rank", path, files.reads(), files.size());
}

TensorSource initial_parameter_values(const RunConfig& cfg) {
  std::shared_ptr<const WeightFiles> files;
  if (!cfg.checkpoint.init_from.empty()) {
    const ModelWeights weights = check_initial_weights(cfg.checkpoint.init_from, cfg.model);
    files = std::make_shared<const WeightFiles>(weights.files, weights.parameter_name, cfg.checkpoint.init_from);
  }
  const Transformer shapes(cfg.model, TensorParallel{}, PipelineStage{}, ParameterStorage::Deferred);
  return [files, shapes, seed = static_cast<uint64_t>(cfg.seed)](const std::string& name) {
    if (files && files->holds(name)) return files->read(name);
    const auto params = shapes->named_parameters();
    const auto* p = params.find(name);
    if (!p) throw std::runtime_error("the model has no parameter '" + name + "'");
    auto values = torch::empty(p->sizes(), torch::kFloat32);
    shapes->initialise_parameter(name, values, seed);
    return values;
  };
}

}  // namespace tide
