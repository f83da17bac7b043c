// Faults a test asks a run for, through TrainHooks::loss_tap: the training loop never
// branches on them.
#pragma once

#include <cstdint>
#include <set>

#include "tide/engine/train/trainer.h"

namespace tide {

// The first micro-batch's loss of each 1-based step in `steps` made NaN (its gradients
// with it), once per process: a rollback that replays the step trains it normally.
LossTap nan_loss_at_steps(std::set<int64_t> steps);

// nan_loss_at_steps from TIDE_INJECT_NAN_AT="12,30" in the environment (the workers' under
// a daemon; docs/daemon.md); empty when it is unset. Throws naming it when malformed.
LossTap loss_tap_from_environment();

}  // namespace tide
