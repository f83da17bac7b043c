#include "anomaly.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/parallel/comm.h"

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
    if (z > cfg_.spike_z && (every_kind_ || cfg_.on_loss_spike != AnomalyAction::None)) {
      a.kind = "loss_spike";
      a.value = loss;
      a.score = z;
      a.action = cfg_.on_loss_spike;
      return a;
    }
    const double norm_med = median(std::vector<double>(norms_.begin(), norms_.end()));
    const double multiple = grad_norm / std::max(norm_med, 1e-12);
    if (multiple > cfg_.explosion_factor && (every_kind_ || cfg_.on_grad_explosion != AnomalyAction::None)) {
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

std::optional<AnomalyDecision> decide_anomaly(const std::function<nlohmann::json(const nlohmann::json&)>& policy,
                                              Comm* world, int64_t step, const Anomaly& anomaly, spdlog::logger& log) {
  std::string answer;
  if (!world || world->rank() == 0) {
    nlohmann::json query = {{"step", step},
                            {"kind", anomaly.kind},
                            {"value", std::isfinite(anomaly.value) ? nlohmann::json(anomaly.value) : nlohmann::json()},
                            {"score", anomaly.score},
                            {"action", anomaly_action_name(anomaly.action)}};
    try {
      answer = policy(query).dump();
    } catch (const std::exception& e) {
      log.warn("step {}: on_anomaly failed ({}); the recipe's action {} stands", step, e.what(),
                   anomaly_action_name(anomaly.action));
    }
  }
  if (world) answer = world->broadcast_text(answer, 0, "anomaly decision");
  const auto d = parse_json_or_discard(answer);
  if (!d.is_object() || !d.contains("action") || !d["action"].is_string()) return std::nullopt;
  try {
    AnomalyDecision out;
    out.action = parse_anomaly_action(d["action"].get<std::string>(), "on_anomaly");
    if (d.contains("lr_factor") && d["lr_factor"].is_number()) out.lr_factor = d["lr_factor"].get<double>();
    return out;
  } catch (const std::exception& e) {
    if (!world || world->rank() == 0) log.warn("step {}: {}; the recipe's action stands", step, e.what());
    return std::nullopt;
  }
}

AnomalyJudge::AnomalyJudge(const AnomalyConfig& cfg, Policy policy, Comm* world, spdlog::logger& log)
    : cfg_(cfg), detector_(cfg, static_cast<bool>(policy)), policy_(std::move(policy)), world_(world), log_(log) {}

void AnomalyJudge::set_config(const AnomalyConfig& cfg) {
  cfg_ = cfg;
  detector_.set_config(cfg);
}

AnomalyJudge::Verdict AnomalyJudge::judge(int64_t step, double loss, double grad_norm) {
  Verdict v;
  v.anomaly = detector_.check(loss, grad_norm);
  v.lr_factor = cfg_.lr_factor;
  if (!v.anomaly || !policy_) return v;
  if (const auto decision = decide_anomaly(policy_, world_, step, v.anomaly, log_)) {
    v.anomaly.action = decision->action;
    v.lr_factor = decision->lr_factor.value_or(v.lr_factor);
    v.decided_by = "on_anomaly";
  }
  return v;
}

}  // namespace tide
