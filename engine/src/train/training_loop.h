// The training loop of one rank (internal): step boundaries with live control, one
// TrainStep per step, the anomaly check and response, metrics and progress, evaluation
// and checkpoints when due, and the run's end (weights, summary).
//
// The host never waits for the device inside a step: a step's loss and gradient norm stay
// on the device, which clips and skips the update by itself (UpdateGate), and the host
// reads them one step late, after it has queued the next step's forward and backward, to
// judge, report and respond. A step is settled at once instead where its end has work
// that must see it (evaluation, a checkpoint, the last step, a checkpoint or stop asked
// for at the boundary) and with an on_anomaly policy, whose answer decides the update.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "anomaly.h"
#include "live_control.h"
#include "step_graphs.h"
#include "step_meter.h"
#include "step_profiler.h"
#include "step_readout.h"
#include "tensorboard_log.h"
#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/io/step_rows.h"
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
  using Changes = std::vector<std::pair<std::string, std::string>>;

  // A step updated on the device, not yet read by the host.
  struct PendingStep {
    int64_t step = 0;  // 0-based
    StepReadout readout;
    std::optional<AnomalyJudge::Verdict> verdict;  // judged before the update (policy)
    double lr = 0;
    StepMeter::StepCost cost;
    int64_t tokens = 0;
    Changes changes;  // live changes applied at its boundary
  };

  // All ranks' tokens in a step; the batch size may change live.
  int64_t tokens_per_step() const { return cfg_.batch.global_batch * cfg_.data.seq_len; }
  void resume();
  void open_metrics();
  void watch_checkpoints();
  std::vector<Batch> next_batches(int64_t n);
  // The boundary before 0-based step `step`: the commands every rank applies there (into
  // `changes`). True: stop (asked for, after a checkpoint; or an anomaly's stop when the
  // step before was settled for a checkpoint). A rollback then moves `step`.
  bool at_boundary(int64_t& step, Changes& changes);
  void apply(const std::vector<LiveEffect>& effects);
  // Forward, backward and the gated update of 0-based step `step`; pending_ then holds it.
  // Before the update the step before it is settled (rolled_back: `step` is the one to
  // go on from, and `batches` are carried to it; stop: result_ says where).
  Next run_step(int64_t& step, const Changes& changes);
  // Reads, judges and reports pending_ (0-based step p); `step_end`: also its evaluation
  // and checkpoint when due. A rollback sets `step` to the step before the checkpoint's.
  Next settle(int64_t& step, bool step_end);
  bool step_end_has_work(int64_t step) const;
  void measure(StepMetrics& m, const PendingStep& p, const StepLoss& loss);
  // Each evaluable dataset's validation loss (into m.val_losses under a blend) and their
  // mean weighted by the blend's shares, into m.val_loss.
  void validate(StepMetrics& m);
  void report(const StepMetrics& m, bool anomaly);
  // After an anomalous step: the event, and a rollback (step becomes the checkpoint's) or a stop.
  Next respond(const AnomalyJudge::Verdict& v, const StepMetrics& m, int64_t& step);
  void save_checkpoint(int64_t steps_done);
  void restore_loss_scale(const ResumeState& state);  // fp16: the scale the checkpoint kept
  TrainResult stopped(int64_t steps);
  TrainResult finish();

  Trainer::State& s_;
  const RunConfig& cfg_;  // s_.cfg: follows live changes
  std::function<double(int64_t)> scheduled_lr_;
  TrainStep step_;
  StepMeter meter_;
  AnomalyJudge judge_;
  StepGraphs graphs_;
  StepProfiler profiler_;
  std::unique_ptr<LiveControl> control_;  // null: no live control
  ResumeState resumed_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<JsonlWriter> metrics_;  // the leader's
  std::unique_ptr<TensorBoardLog> tensorboard_;  // the leader's, beside metrics_
  ProgressLine progress_;
  // The datasets whose validation split holds a window, with their shares renormalised
  // over these: validation and the unigram baseline are their weighted means.
  std::vector<std::pair<size_t, double>> evaluable_;
  TrainResult result_;
  int64_t tokens_seen_ = 0;
  // The steps since the last progress line: its speed is theirs (one step's own time is
  // the host's, which on a GPU runs ahead of the device and waits for it later).
  int64_t shown_tokens_seen_ = 0;
  double unshown_seconds_ = 0;
  int64_t saved_step_ = -1;  // the newest checkpoint's step
  std::optional<PendingStep> pending_;
  std::vector<Batch> carried_;  // drawn for a step a rollback discarded: the next step's
};

}  // namespace tide
