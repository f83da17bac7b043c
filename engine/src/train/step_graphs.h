// A training step's device work as CUDA graphs (internal): captured once the step's
// shapes are fixed, replayed after, so that a step costs the device two graph launches
// instead of thousands of kernel launches from the host.
//
// Two graphs, not one: the forward and backward of the step's micro-batches, then the
// update (the anomaly gate, clipping, AdamW). Between them the host settles the step
// before (reads its loss, judges it, logs it) while the device runs this step's forward
// and backward; the update needs what that settling decides, the learning rate and the
// anomaly limits, and reads both from device tensors written before each replay.
//
// Where capture is impossible (not a CUDA device, a setting that needs the host inside
// the step) every call runs its work as it comes, and the run log says why once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "tide/engine/config.h"
#include "tide/engine/data/batch_loader.h"
#include "train_step.h"

namespace spdlog {
class logger;
}

namespace tide {

// What, beside the recipe, decides whether a run's steps can be captured.
struct StepCaptureFacts {
  bool cuda_build = false;           // this LibTorch has CUDA (and so CUDA graphs)
  bool distributed = false;          // the run has ranks: their collectives stay uncaptured
  bool loss_tap = false;             // a hook sees each micro-batch's loss on the host
  bool anomaly_policy = false;       // the recipe's on_anomaly judges each step on the host
  bool optimizer_on_device = false;  // the update reads nothing on the host (fused AdamW)
};

// Why this run's steps run uncaptured (a sentence that names the setting), or nothing
// where they can be captured.
std::optional<std::string> why_steps_run_uncaptured(const RunConfig& cfg, const StepCaptureFacts& facts);

// Whether this build's LibTorch has CUDA graphs.
bool step_graphs_built();

class StepGraphs {
 public:
  // blocker: why_steps_run_uncaptured's answer for this run; on a CUDA device the log
  // says it once.
  StepGraphs(c10::Device device, std::optional<std::string> blocker, spdlog::logger& log);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  using ForwardBackward = std::function<StepValues(const std::vector<Batch>&)>;
  // What fn gives for `batches`. The first steps run fn as called (on the graphs' own
  // stream, where the libraries set themselves up); then it is captured with the batches
  // copied into buffers of its own, and later calls copy theirs there and replay it. The
  // values returned by a replay are the same tensors each step, overwritten by the next.
  StepValues forward_backward(const std::vector<Batch>& batches, const ForwardBackward& fn);
  // update's result (the step's skip flag), in the same way; called once after each
  // forward_backward, with what the update reads on the host written to the device.
  at::Tensor update(const std::function<at::Tensor()>& fn);
  // Something the graphs hold fixed changed (a setting, weights loaded from a
  // checkpoint): the next steps run as called, then are captured again.
  void reset(const std::string& why);
  // Steps whose work was replayed from graphs.
  int64_t replayed_steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide
