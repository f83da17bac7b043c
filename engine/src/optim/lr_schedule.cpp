#include "tide/engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace tide {

double scheduled_lr(const ScheduleConfig& s, double peak_lr, int64_t step) {
  if (step < s.warmup_steps)
    return peak_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  const int64_t span = std::max<int64_t>(1, s.steps - s.warmup_steps);
  const double progress = std::clamp(static_cast<double>(step - s.warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  switch (s.decay) {
    case DecayKind::Cosine: return s.min_lr + 0.5 * (peak_lr - s.min_lr) * (1.0 + std::cos(M_PI * progress));
    case DecayKind::Linear: return peak_lr - (peak_lr - s.min_lr) * progress;
    case DecayKind::Constant:
    case DecayKind::Lua: break;  // a Lua schedule is evaluated by the caller
  }
  return peak_lr;
}

}  // namespace tide
