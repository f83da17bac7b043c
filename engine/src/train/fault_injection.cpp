#include "tide/engine/train/fault_injection.h"

#include <cstdlib>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include <spdlog/spdlog.h>

namespace tide {

LossTap nan_loss_at_steps(std::set<int64_t> steps) {
  auto left = std::make_shared<std::set<int64_t>>(std::move(steps));
  return [left](int64_t step, int64_t micro, const at::Tensor& loss) {
    if (micro != 0 || left->erase(step + 1) == 0) return loss;
    spdlog::warn("step {}: injecting a NaN loss (TIDE_INJECT_NAN_AT)", step + 1);
    return loss * std::numeric_limits<double>::quiet_NaN();
  };
}

LossTap loss_tap_from_environment() {
  const char* v = std::getenv("TIDE_INJECT_NAN_AT");
  if (!v) return {};
  std::set<int64_t> steps;
  std::stringstream in(v);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) continue;
    size_t used = 0;
    int64_t step = 0;
    try {
      step = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || step < 1)
      throw std::invalid_argument("TIDE_INJECT_NAN_AT: '" + item + "' is not a step number (1, 2, ...)");
    steps.insert(step);
  }
  return nan_loss_at_steps(std::move(steps));
}

}  // namespace tide
