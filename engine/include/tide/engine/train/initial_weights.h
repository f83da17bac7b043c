// checkpoint.init_from: a run that starts from given weights (fine-tuning, continued
// pretraining) instead of its random initialisation.
#pragma once

#include <functional>
#include <string>

#include "tide/engine/config.h"
#include "tide/engine/model/model_weights.h"

namespace at {
class Tensor;
}

namespace tide {

class Checkpointer;

// The weights at `path` (model_weights.h: a run directory, a weights file written by tide,
// a Hugging Face directory), found and checked against the recipe's model without reading
// a tensor. Throws ConfigError on checkpoint.init_from naming the path, and each model
// field that changes what the weights mean ("model.dim = 64 in the recipe, 128 in
// <path>"). Training-only fields (dropout, initialisation, recomputation) may differ, and
// so may max_seq_len where no learned position table depends on it. tided checks a
// submitted run with it, so that a run that cannot start is never queued.
ModelWeights check_initial_weights(const std::string& path, const ModelConfig& recipe);

// Every rank: reads the parts of the weights at `path` that it holds (its stage, its
// tensor-parallel slice, its ZeRO pieces), one tensor at a time from the mapped files,
// into the model and optimizer that `checkpointer` saves. Throws as check_initial_weights
// does, and naming the parameter a file lacks.
void load_initial_weights(const std::string& path, const ModelConfig& recipe, Checkpointer& checkpointer);

// The whole initial values of each parameter of `cfg`'s model, one process's: the tensor
// of checkpoint.init_from where that is set and holds it, else the seed's draw (as a run
// of any layout starts). What a LoRA checkpoint's frozen base is made from again.
std::function<at::Tensor(const std::string&)> initial_parameter_values(const RunConfig& cfg);

}  // namespace tide
