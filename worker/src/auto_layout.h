// parallel.auto at launch: the planner's choice for the ranks the run gets, as recipe
// overrides, so that every rank trains the same layout.
#pragma once

#include <string>
#include <vector>

#include "tide/engine/config.h"

namespace tide::worker {

// The overrides that give `cfg` (parallel.auto on) the planner's layout for `nodes` x
// `ranks_per_node` ranks on cfg.device, logged with the runner-up. `independent`: each
// rank decides on its own (ranks started by srun, Kubernetes or torchrun's variables, or
// one launcher per node): the decision must not depend on a measurement taken now, so a
// CPU run then needs a stored calibration (tide plan --calibrate). Throws ConfigError
// ("parallel.auto") when nothing fits or a stored calibration is needed and missing.
std::vector<std::string> auto_layout_overrides(const RunConfig& cfg, int nodes, int ranks_per_node, bool independent);

}  // namespace tide::worker
