#include "anomaly.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tide {
namespace {
// Fewer recent steps than this: no verdict on spikes or explosions yet.
constexpr size_t kMinWindow = 8;

double median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}
}  // namespace

const char* action_name(AnomalyAction a) {
  switch (a) {
    case AnomalyAction::None: return "none";
    case AnomalyAction::Skip: return "skip";
    case AnomalyAction::Rollback: return "rollback";
    case AnomalyAction::ScaleLr: return "scale_lr";
    case AnomalyAction::Stop: return "stop";
  }
  return "none";
}

Anomaly AnomalyDetector::check(double loss, double grad_norm) {
  Anomaly a;
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    a.kind = "nonfinite";
    a.value = std::isfinite(loss) ? grad_norm : loss;
    a.action = cfg_.on_nonfinite;
    return a;
  }
  if (losses_.size() >= kMinWindow) {
    const std::vector<double> window(losses_.begin(), losses_.end());
    const double med = median(window);
    std::vector<double> dev;
    for (const double x : window) dev.push_back(std::abs(x - med));
    // 1.4826 x MAD estimates the standard deviation of normal data; the floor keeps a
    // flat window from turning rounding into a spike.
    const double sigma = std::max(1.4826 * median(dev), 1e-3 * std::abs(med) + 1e-12);
    const double z = (loss - med) / sigma;
    if (z > cfg_.spike_z && cfg_.on_loss_spike != AnomalyAction::None) {
      a.kind = "loss_spike";
      a.value = loss;
      a.score = z;
      a.action = cfg_.on_loss_spike;
      return a;
    }
    const double norm_med = median(std::vector<double>(norms_.begin(), norms_.end()));
    const double multiple = grad_norm / std::max(norm_med, 1e-12);
    if (multiple > cfg_.explosion_factor && cfg_.on_grad_explosion != AnomalyAction::None) {
      a.kind = "grad_explosion";
      a.value = grad_norm;
      a.score = multiple;
      a.action = cfg_.on_grad_explosion;
      return a;
    }
  }
  losses_.push_back(loss);
  norms_.push_back(grad_norm);
  while (losses_.size() > static_cast<size_t>(cfg_.window)) losses_.pop_front();
  while (norms_.size() > static_cast<size_t>(cfg_.window)) norms_.pop_front();
  return a;
}

}  // namespace tide
