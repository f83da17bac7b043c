// The training loop of one rank (internal): step boundaries with live control, one
// TrainStep per step, the anomaly check and response, metrics and progress, evaluation
// and checkpoints when due, and the run's end (weights, summary).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "anomaly.h"
#include "live_control.h"
#include "step_meter.h"
#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/train/metrics.h"
#include "train_step.h"
#include "trainer_state.h"

namespace tide {

class TrainingLoop {
 public:
  explicit TrainingLoop(Trainer::State& s);
  TrainResult run();

 private:
  enum class Next { step, rolled_back, stop };

  // All ranks' tokens in a step; the batch size may change live.
  int64_t tokens_per_step() const { return cfg_.batch.global_batch * cfg_.data.seq_len; }
  void resume();
  void open_metrics();
  void watch_checkpoints();
  std::vector<Batch> next_batches(int64_t n);
  // The boundary before 0-based step `step`: the commands every rank applies there.
  // True: a stop was asked for (after a checkpoint).
  bool at_boundary(int64_t step, StepMetrics& m);
  void apply(const std::vector<LiveEffect>& effects);
  void measure(StepMetrics& m, int64_t step, const StepLoss& loss, double lr);
  void report(const StepMetrics& m, bool anomaly);
  // After an anomalous step: the event, and a rollback (step becomes the checkpoint's) or a stop.
  Next respond(const AnomalyJudge::Verdict& v, const StepMetrics& m, int64_t& step);
  void save_checkpoint(int64_t steps_done);
  TrainResult stopped(int64_t steps);
  TrainResult finish();
  void save_weights(const std::string& path);

  Trainer::State& s_;
  const RunConfig& cfg_;  // s_.cfg: follows live changes
  std::function<double(int64_t)> scheduled_lr_;
  TrainStep step_;
  StepMeter meter_;
  AnomalyJudge judge_;
  std::unique_ptr<LiveControl> control_;  // null: no live control
  ResumeState resumed_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<JsonlWriter> metrics_;  // the leader's
  ProgressLine progress_;
  bool can_eval_ = false;
  TrainResult result_;
  int64_t tokens_seen_ = 0;
  int64_t saved_step_ = -1;  // the newest checkpoint's step
};

}  // namespace tide
