// The single-process training loop: data → forward/backward with gradient
// accumulation → clip → AdamW → metrics, validation and weights in the run directory.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <spdlog/common.h>

#include "tide/engine/config.h"
#include "tide/engine/train/metrics.h"

namespace tide {

struct Distributed;

// Given the loss of micro-batch `micro` of 0-based step `step`, where a rank computes it,
// the loss to use: a seam for tests' fault injection (fault_injection.h).
using LossTap = std::function<at::Tensor(int64_t step, int64_t micro, const at::Tensor& loss)>;

struct TrainHooks {
  // Learning rate of 0-based step `step` when the schedule is a Lua function.
  std::function<double(int64_t step)> lr;
  std::function<void(const StepMetrics&)> on_step;
  bool show_progress = true;
  double peak_flops = 0;  // FLOP/s for MFU; 0: measured with a matmul probe
  // A checkpoint directory to resume from, "auto" for the newest one of the run
  // directory that verifies (none: start afresh), or empty.
  std::string resume;

  // Live control (a run under tided). Every rank sets `controlled`; on rank 0,
  // `take_commands` returns the commands that arrived since its last call, as a JSON
  // array text ("" for none; docs/protocol.md, worker link). Rank 0 broadcasts them at
  // each step boundary and every rank applies them there.
  bool controlled = false;
  std::function<std::string()> take_commands;
  // Rank 0: what the run did, for the controller ("applied", "rejected", "paused",
  // "resumed", "stopping", "checkpoint", "checkpoint_failed"); may be called from the
  // checkpoint writer's thread.
  std::function<void(const std::string& kind, const nlohmann::json& body)> on_event;
  // The recipe's on_anomaly policy (docs/recipes.md, "Policies"), set on every rank when
  // the recipe has one; only rank 0's is called, with {step, kind, value, score, action},
  // and its answer reaches every rank: null (the declared action stands) or {"action":
  // name, "lr_factor": x (optional)}. It may throw: the declared action stands.
  std::function<nlohmann::json(const nlohmann::json& anomaly)> anomaly_policy;
  // More destinations for the run log (train.log), e.g. the controller's log events.
  std::vector<spdlog::sink_ptr> log_sinks;
  // Empty: every loss as computed.
  LossTap loss_tap;
};


struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  std::optional<double> final_val_loss;
  double unigram_baseline = 0;  // validation split's unigram entropy (nats)
  std::string weights_path;
  bool stopped = false;  // a stop command ended it early, after a checkpoint
  int64_t replayed_steps = 0;  // steps replayed from CUDA graphs (cuda_graphs)
};

class Trainer {
 public:
  // run_dir is created; config.json is written at once. With `dist`, this process is
  // one rank of a data-parallel job: rank 0 writes the run directory's files, the others
  // only their own log (train-rank<N>.log).
  Trainer(const RunConfig& cfg, std::string run_dir, TrainHooks hooks = {}, Distributed* dist = nullptr);
  ~Trainer();
  TrainResult run();

  struct State;  // what the constructor set up (trainer.cpp)

 private:
  std::unique_ptr<State> s_;
};

}  // namespace tide
