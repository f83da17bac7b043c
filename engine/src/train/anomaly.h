// Training anomalies: a non-finite loss or gradient norm, a loss spike (robust z-score of
// the loss against a window of recent losses) and a gradient-norm explosion (a multiple
// of the window's median norm). Every rank sees the same reduced loss and norm, so every
// rank reaches the same verdict and takes the same action without a collective.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace spdlog {
class logger;
}

#include "tide/engine/config.h"

namespace tide {

struct Anomaly {
  std::string kind;  // "", "nonfinite", "loss_spike", "grad_explosion"
  double value = 0;  // the loss, or the norm
  double score = 0;  // z-score, or multiple of the median norm
  AnomalyAction action = AnomalyAction::None;
  explicit operator bool() const { return !kind.empty(); }
};

class AnomalyDetector {
 public:
  // every_kind: flag spikes and explosions even when their declared action is none (a
  // recipe policy decides what they trigger).
  AnomalyDetector(const AnomalyConfig& cfg, bool every_kind) : cfg_(cfg), every_kind_(every_kind) {}
  // The verdict on one step; normal steps enter the window, anomalous ones do not.
  Anomaly check(double loss, double grad_norm);
  void set_config(const AnomalyConfig& cfg) { cfg_ = cfg; }

 private:
  AnomalyConfig cfg_;
  bool every_kind_;
  std::deque<double> losses_, norms_;
};

class Comm;

// What a recipe's on_anomaly policy decided.
struct AnomalyDecision {
  AnomalyAction action = AnomalyAction::None;
  std::optional<double> lr_factor;  // scale_lr's factor, when the policy gave one
};

// Every rank, at an anomaly of 1-based step `step`: rank 0 (world rank 0, or the only
// process when world is null) asks `policy`; every rank gets its decision. nullopt: the
// declared action stands (the policy answered nil, failed, or answered nonsense; the
// failures go to rank 0's `log`).
std::optional<AnomalyDecision> decide_anomaly(const std::function<nlohmann::json(const nlohmann::json&)>& policy,
                                              Comm* world, int64_t step, const Anomaly& anomaly, spdlog::logger& log);

// The anomaly check of every step: the detector's verdict, and on an anomaly the
// recipe's on_anomaly policy's decision when it has one (every rank gets the same).
class AnomalyJudge {
 public:
  using Policy = std::function<nlohmann::json(const nlohmann::json&)>;
  struct Verdict {
    Anomaly anomaly;  // false: a normal step
    std::string decided_by = "recipe";  // or "on_anomaly"
    double lr_factor = 0;               // what scale_lr multiplies optimizer.lr_scale by
  };
  // world: every rank of the job (null: one process); policy may be empty.
  AnomalyJudge(const AnomalyConfig& cfg, Policy policy, Comm* world, spdlog::logger& log);
  // 1-based step; the loss and global norm are the same on every rank.
  Verdict judge(int64_t step, double loss, double grad_norm);
  void set_config(const AnomalyConfig& cfg);

 private:
  AnomalyConfig cfg_;
  AnomalyDetector detector_;
  Policy policy_;
  Comm* world_;
  spdlog::logger& log_;
};

}  // namespace tide
