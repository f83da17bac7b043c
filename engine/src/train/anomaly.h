// Training anomalies: a non-finite loss or gradient norm, a loss spike (robust z-score of
// the loss against a window of recent losses) and a gradient-norm explosion (a multiple
// of the window's median norm). Every rank sees the same reduced loss and norm, so every
// rank reaches the same verdict and takes the same action without a collective.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

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
  explicit AnomalyDetector(const AnomalyConfig& cfg) : cfg_(cfg) {}
  // The verdict on one step; normal steps enter the window, anomalous ones do not.
  Anomaly check(double loss, double grad_norm);
  void set_config(const AnomalyConfig& cfg) { cfg_ = cfg; }

 private:
  AnomalyConfig cfg_;
  std::deque<double> losses_, norms_;
};

const char* action_name(AnomalyAction a);

}  // namespace tide
