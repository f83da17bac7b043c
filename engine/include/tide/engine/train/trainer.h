// The single-process training loop: data → forward/backward with gradient
// accumulation → clip → AdamW → metrics, validation and weights in the run directory.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tide/engine/config.h"
#include "tide/engine/train/metrics.h"

namespace tide {

struct Distributed;

struct TrainHooks {
  // Learning rate of 0-based step `step` when the schedule is a Lua function.
  std::function<double(int64_t step)> lr;
  std::function<void(const StepMetrics&)> on_step;
  bool show_progress = true;
  double peak_flops = 0;  // FLOP/s for MFU; 0: measured with a matmul probe
  // A checkpoint directory to resume from, "auto" for the newest one of the run
  // directory that verifies (none: start afresh), or empty.
  std::string resume;
};

// Refuses, naming the fields, a layout this engine cannot run on `world` ranks (the
// factors do not fit, or a part not built yet). Called by the launcher before it
// starts workers and by every Trainer.
void check_supported_layout(const RunConfig& cfg, int world);
// Sequences per micro-batch: batch.micro_batch, or derived from parallel.micro_batches.
int64_t micro_batch_size(const RunConfig& cfg, int dp);

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  std::optional<double> final_val_loss;
  double unigram_baseline = 0;  // validation split's unigram entropy (nats)
  std::string weights_path;
};

class Trainer {
 public:
  // run_dir is created; config.json is written at once. With `dist`, this process is
  // one rank of a data-parallel job: rank 0 writes the run directory's files, the others
  // only their own log (train-rank<N>.log).
  Trainer(const RunConfig& cfg, std::string run_dir, TrainHooks hooks = {}, Distributed* dist = nullptr);
  ~Trainer();
  TrainResult run();

 private:
  // Every rank calls it; the leader writes.
  void save_weights(const std::string& path);
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tide
