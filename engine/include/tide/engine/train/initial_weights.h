// checkpoint.init_from: a run that starts from given weights (fine-tuning, continued
// pretraining) instead of its random initialisation.
#pragma once

#include <string>

#include "tide/engine/config.h"

namespace tide {

class Checkpointer;

// Every rank: reads the parts of the weights at `path` that it holds (its stage, its
// tensor-parallel slice, its ZeRO pieces), one tensor at a time from the mapped files,
// into the model and optimizer that `checkpointer` saves. Throws naming the path and the
// field or parameter when they do not fit the recipe's model: each model field that
// changes what the weights mean ("model.dim = 64 in the recipe, 128 in <path>").
// Training-only fields (dropout, initialisation, recomputation) may differ, and so may
// max_seq_len where no learned position table depends on it.
void load_initial_weights(const std::string& path, const ModelConfig& recipe, Checkpointer& checkpointer);

}  // namespace tide
