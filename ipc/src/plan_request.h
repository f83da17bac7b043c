// The `plan` request (docs/protocol.md): a recipe's layouts ranked on a described
// cluster, the plan `tide plan --json` prints. Its fields are checked here, before the
// recipe is evaluated; the planning runs on the recipe evaluator's thread.
#pragma once

#include <cstddef>
#include <functional>

#include <nlohmann/json.hpp>

#include "tide/engine/plan/plan.h"

namespace tide::ipc {

struct PlanRequest {
  Cluster cluster;
  PlanOptions options;
  size_t top = 10;
};

// `local_cpu(ranks)` describes this machine's CPU shared by `ranks` processes (the daemon's
// stored calibration, or nominal figures). Throws ProtocolError(bad_request) naming the
// field and the value.
PlanRequest parse_plan_request(const nlohmann::json& body, const std::function<DeviceSpec(int ranks)>& local_cpu);

}  // namespace tide::ipc
