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

#include <ATen/core/Tensor.h>
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
  // Above these a loss is a spike and a norm an explosion: from the window, infinite
  // until it holds enough steps and for kinds that are not flagged.
  struct Limits {
    double loss, grad_norm;
  };
  // every_kind: flag spikes and explosions even when their declared action is none (a
  // recipe policy decides what they trigger).
  // loss_scaled (fp16): a gradient norm that overflowed under a finite loss is the loss
  // scaler's to handle (it skips the update and lowers the scale), not an anomaly.
  AnomalyDetector(const AnomalyConfig& cfg, bool every_kind, bool loss_scaled = false)
      : cfg_(cfg), every_kind_(every_kind), loss_scaled_(loss_scaled) {}
  // The verdict on one step; normal steps enter the window, anomalous ones do not.
  Anomaly check(double loss, double grad_norm);
  Limits limits() const;
  const AnomalyConfig& config() const { return cfg_; }
  void set_config(const AnomalyConfig& cfg) { cfg_ = cfg; }

 private:
  struct Window {
    double loss_median, loss_sigma, norm_median;
  };
  Window window() const;  // with kMinWindow steps at least
  Limits limits(const Window& w) const;

  AnomalyConfig cfg_;
  bool every_kind_;
  bool loss_scaled_;
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
// Without a policy the update's skip decision is made on the device, from the limits of
// the steps judged before, so the host can judge a step after the next has been queued.
class AnomalyJudge {
 public:
  using Policy = std::function<nlohmann::json(const nlohmann::json&)>;
  struct Verdict {
    Anomaly anomaly;  // false: a normal step
    std::string decided_by = "recipe";  // or "on_anomaly"
    double lr_factor = 0;               // what scale_lr multiplies optimizer.lr_scale by
  };
  // world: every rank of the job (null: one process); policy may be empty; loss_scaled:
  // fp16 (AnomalyDetector).
  AnomalyJudge(const AnomalyConfig& cfg, Policy policy, Comm* world, spdlog::logger& log, bool loss_scaled = false);
  // 1-based step; the loss and global norm are the same on every rank.
  Verdict judge(int64_t step, double loss, double grad_norm);
  // False with an on_anomaly policy: its answer decides whether an update is skipped, so
  // a step must be judged before its update.
  bool judges_on_device() const { return !policy_; }
  // The update's skip flag (a bool scalar on their device) for a step's loss and norm
  // still on the device: what judge() decides for them when next called. No policy only.
  // It compares them with the limits begin_step() wrote to the device, so a captured
  // update (CUDA graphs) replays with each step's limits; only a configuration change
  // alters the work it does.
  at::Tensor skip_on_device(const at::Tensor& loss, const at::Tensor& grad_norm) const;
  // Takes effect at the next begin_step(), so that a step gated on the device is judged
  // under the configuration it was gated by.
  void set_config(const AnomalyConfig& cfg);
  // Before a step is gated (skip_on_device) or judged at its update: the configuration
  // set last, and the window's limits written to `device` without waiting for it.
  void begin_step(const c10::Device& device);

 private:
  AnomalyConfig cfg_;
  std::optional<AnomalyConfig> next_cfg_;
  AnomalyDetector detector_;
  at::Tensor limits_;  // fp64 {loss, grad_norm} on the step's device; infinite: no limit
  Policy policy_;
  Comm* world_;
  spdlog::logger& log_;
  bool loss_scaled_;
};

}  // namespace tide
