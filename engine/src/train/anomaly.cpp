#include "anomaly.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

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

AnomalyDetector::Window AnomalyDetector::window() const {
  const std::vector<double> losses(losses_.begin(), losses_.end());
  Window w{};
  w.loss_median = median(losses);
  std::vector<double> dev;
  for (const double x : losses) dev.push_back(std::abs(x - w.loss_median));
  // 1.4826 x MAD estimates the standard deviation of normal data; the floor keeps a
  // flat window from turning rounding into a spike.
  w.loss_sigma = std::max(1.4826 * median(dev), 1e-3 * std::abs(w.loss_median) + 1e-12);
  w.norm_median = std::max(median(std::vector<double>(norms_.begin(), norms_.end())), 1e-12);
  return w;
}

AnomalyDetector::Limits AnomalyDetector::limits(const Window& w) const {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const bool spikes = every_kind_ || cfg_.on_loss_spike != AnomalyAction::None;
  const bool explosions = every_kind_ || cfg_.on_grad_explosion != AnomalyAction::None;
  return {spikes ? w.loss_median + cfg_.spike_z * w.loss_sigma : inf,
          explosions ? cfg_.explosion_factor * w.norm_median : inf};
}

AnomalyDetector::Limits AnomalyDetector::limits() const {
  constexpr double inf = std::numeric_limits<double>::infinity();
  return losses_.size() >= kMinWindow ? limits(window()) : Limits{inf, inf};
}

Anomaly AnomalyDetector::check(double loss, double grad_norm) {
  Anomaly a;
  if (loss_scaled_ && std::isfinite(loss) && !std::isfinite(grad_norm)) return a;  // outside the window too
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    a.kind = "nonfinite";
    a.value = std::isfinite(loss) ? grad_norm : loss;
    a.action = cfg_.on_nonfinite;
    return a;
  }
  if (losses_.size() >= kMinWindow) {
    // The comparisons skip_on_device makes, on the same doubles: host and device agree.
    const Window w = window();
    const Limits lim = limits(w);
    if (loss > lim.loss) {
      a.kind = "loss_spike";
      a.value = loss;
      a.score = (loss - w.loss_median) / w.loss_sigma;
      a.action = cfg_.on_loss_spike;
      return a;
    }
    if (grad_norm > lim.grad_norm) {
      a.kind = "grad_explosion";
      a.value = grad_norm;
      a.score = grad_norm / w.norm_median;
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

AnomalyJudge::AnomalyJudge(const AnomalyConfig& cfg, Policy policy, Comm* world, spdlog::logger& log, bool loss_scaled)
    : cfg_(cfg),
      detector_(cfg, static_cast<bool>(policy), loss_scaled),
      policy_(std::move(policy)),
      world_(world),
      log_(log),
      loss_scaled_(loss_scaled) {}

void AnomalyJudge::set_config(const AnomalyConfig& cfg) { next_cfg_ = cfg; }

void AnomalyJudge::begin_step(const c10::Device& device) {
  if (next_cfg_) {
    cfg_ = *next_cfg_;
    detector_.set_config(cfg_);
    next_cfg_.reset();
  }
  if (policy_) return;  // judged on the host
  at::NoGradGuard no_grad;
  if (!limits_.defined() || limits_.device() != device)
    limits_ = at::empty({2}, at::TensorOptions().dtype(at::kDouble).device(device));
  // Fills, not a copy from host memory: a copy from pageable memory waits for the device.
  const AnomalyDetector::Limits lim = detector_.limits();
  limits_.select(0, 0).fill_(lim.loss);
  limits_.select(0, 1).fill_(lim.grad_norm);
}

at::Tensor AnomalyJudge::skip_on_device(const at::Tensor& loss, const at::Tensor& grad_norm) const {
  TORCH_CHECK(!policy_, "AnomalyJudge: with an on_anomaly policy a step is judged on the host before its update");
  TORCH_CHECK(limits_.defined(), "AnomalyJudge: skip_on_device before begin_step");
  at::NoGradGuard no_grad;
  const auto finite = at::isfinite(loss).logical_and(at::isfinite(grad_norm));
  // Under loss scaling an overflowed norm is no anomaly (the update's gate skips it all the same).
  const auto nonfinite = loss_scaled_ ? at::isfinite(loss).logical_not() : finite.logical_not();
  auto skip = cfg_.on_nonfinite != AnomalyAction::None ? nonfinite : at::zeros_like(finite);
  // Without a policy the limits are infinite for kinds whose action is none (and until the
  // window fills): those are never exceeded, as in check(), which compares the same doubles.
  const auto over = loss.gt(limits_.select(0, 0)).logical_or(grad_norm.gt(limits_.select(0, 1)));
  return skip.logical_or(finite.logical_and(over));
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
