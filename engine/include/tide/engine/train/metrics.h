// Per-step training metrics, their JSON form and the terminal progress line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tide {

struct StepMetrics {
  int64_t step = 0;  // optimizer steps completed
  int64_t total_steps = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens_seen = 0;
  double step_seconds = 0, tokens_per_second = 0, mfu = 0;
  double time = 0;  // when the step ended: Unix seconds, by the clock of rank 0's host
  // Of step_seconds, this rank's time blocked on the data loader and on collectives (the
  // rest is compute); and the time checkpoint saves held training just before the step.
  double data_seconds = 0, comm_seconds = 0, checkpoint_seconds = 0;
  double rss_mb = 0, peak_rss_mb = 0;
  // The most device memory the caching allocator has handed to tensors so far (MiB;
  // PyTorch's max_memory_allocated). 0 on the CPU.
  double peak_gpu_mb = 0;
  // The most host memory tensors held at once so far (MiB), counted by tide's CPU
  // allocator (tensor_memory.h): on the CPU, what the planner's peak predicts.
  double peak_host_tensor_mb = 0;
  double host_tensor_mb = 0;  // what host tensors hold at the step's end
  // What this rank holds of the model state, in bytes, and what it sent this step.
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, comm_bytes = 0;
  // The most held at once, so far, of parameters gathered and gradients waiting to be
  // reduced (ZeRO-2/3), beyond the model state.
  int64_t transient_bytes = 0;
  double eta_seconds = 0;
  bool skipped = false;  // non-finite gradients or an anomaly policy: the update was not applied
  double loss_scale = 0;                // fp16: the loss scale the step's backward used; 0 otherwise
  // model.moe_experts: the blocks' mean load balance E sum_e f_e P_e over the step (1:
  // every expert chosen as often as any, at the router's uniform probabilities).
  std::optional<double> moe_balance;
  // model.moe_experts: the busiest expert's (token, choice) pairs over its block's even
  // share, in the worst block, over the step's whole batch (1: even; E / k at most). Under
  // expert parallelism the busiest rank holds at least its busiest expert's excess.
  std::optional<double> moe_max_load;
  // model.moe_z_loss: the blocks' mean router z statistic, mean(logsumexp(router logits)^2)
  // (the z-loss before its coefficient).
  std::optional<double> moe_z;
  // model.moe_capacity_factor: the share of the step's (token, choice) pairs dropped.
  std::optional<double> moe_dropped;
  std::string anomaly, anomaly_action;  // "loss_spike", ... and what it triggered
  std::optional<double> val_loss;       // under a blend: the datasets' mean, weighted as they are drawn
  std::vector<std::pair<std::string, double>> val_losses;  // under a blend: each dataset's, by name
  // Live changes applied before this step: field and new value (JSON text).
  std::vector<std::pair<std::string, std::string>> changes;
};

nlohmann::json to_json(const StepMetrics& m);
// What differs between the ranks of one step: its step, step/data/comm/checkpoint seconds,
// memory and bytes sent.
nlohmann::json rank_figures(const StepMetrics& m);

// One line of progress on stderr: rewritten in place on a terminal, a new line per
// report otherwise.
class ProgressLine {
 public:
  explicit ProgressLine(std::FILE* out = stderr);
  ~ProgressLine();
  void update(const StepMetrics& m);
  void finish();  // ends the in-place line
  static std::string format(const StepMetrics& m);

 private:
  std::FILE* out_;
  bool tty_;
  bool open_ = false;
};

std::string format_duration(double seconds);

}  // namespace tide
