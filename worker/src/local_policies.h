// A run without a controller (`tide train` by hand): rank 0 calls the recipe's policies
// itself, as a controller would (docs/recipes.md, "Policies").
#pragma once

#include <memory>

#include "tide/engine/train/trainer.h"
#include "tide/scripting/recipe.h"

namespace tide::worker {

// Sets the hooks on every rank; `leader` is rank 0. on_step's commands are applied at
// the next step boundary, the way a controller's are.
void run_policies_locally(TrainHooks& hooks, std::shared_ptr<Recipe> recipe, bool leader);

}  // namespace tide::worker
