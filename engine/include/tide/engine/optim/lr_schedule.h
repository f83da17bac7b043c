// Learning-rate schedules: linear warm-up, then constant, cosine or linear decay to
// min_lr. `step` counts from 0 (the first optimizer step).
#pragma once

#include <cstdint>

#include "tide/engine/config.h"

namespace tide {

double scheduled_lr(const ScheduleConfig& s, double peak_lr, int64_t step);

}  // namespace tide
