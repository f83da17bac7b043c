// The memory and time models behind the planner (plan.h), one layout at a time.
#pragma once

#include "tide/engine/plan/plan.h"

namespace tide::plan {

// Bytes one rank of each pipeline stage holds at its peak; the worst stage's figures.
MemoryEstimate estimate_memory(const RunConfig& cfg, const DeviceSpec& device, const PlanLayout& layout, DType compute);

// One optimizer step's seconds on `cluster`, itemised.
TimeEstimate estimate_time(const RunConfig& cfg, const Cluster& cluster, const PlanLayout& layout, DType compute);

// The compute dtype a run on `device` gets from precision.compute (auto: bf16 on GPUs).
DType planned_compute_dtype(const RunConfig& cfg, const DeviceSpec& device);

}  // namespace tide::plan
