// The rules a run's layout and batch must meet, in one place (no LibTorch): recipe
// validation checks what it can without the world size; the launcher and the daemon's
// submit check the rest before any worker starts, and every worker again.
#pragma once

#include <cstdint>

#include "tide/engine/config.h"

namespace tide {

// Throws ConfigError naming the field when the model cannot be split tp ways (heads,
// key/value heads, MLP width, sequence length for sequence parallelism).
void check_tensor_parallel(const ModelConfig& m, int64_t tp, bool sequence_parallel, int64_t seq_len);

// Throws ConfigError naming the field when context parallelism over cp ranks cannot cut
// the run's sequences (data.seq_len into 2 cp chunks; with sequence parallelism each
// rank's share into tp parts) or meets what it does not combine with (parallel.auto).
void check_context_parallel(const RunConfig& cfg, int64_t cp);

// Throws ConfigError naming the field where a mixture of experts meets what it does not
// combine with: context parallelism, sequence parallelism, experts' biases under tp.
void check_mixture_of_experts(const RunConfig& cfg, int64_t cp, int64_t tp);

// Throws ConfigError naming parallel.ep when expert parallelism over ep ranks cannot
// spread the model's experts (no experts, ep dividing neither them nor dp).
void check_expert_parallel(const RunConfig& cfg, int64_t dp);

// Refuses, naming the fields, a layout this engine cannot run on `world` ranks (the
// factors do not fit, the model cannot be cut, a combination not supported, a batch that
// does not divide, a profiled rank outside the job).
void check_supported_layout(const RunConfig& cfg, int world);

// Sequences per micro-batch: batch.micro_batch, or derived from parallel.micro_batches.
int64_t micro_batch_size(const RunConfig& cfg, int dp);

// How a step's batch is cut, fixed when a job starts: dp ranks, each running
// global_batch / (micro_batch * dp) micro-batches of micro_batch sequences, each sequence
// cut over cp ranks. A live batch.global_batch keeps the micro-batch and changes the
// accumulation.
struct BatchLayout {
  int64_t dp = 1;
  int64_t micro_batch = 1;
  int64_t cp = 1;
  // The ranks that hold the same parameters and average their gradients: dp x cp.
  int64_t replicas() const { return dp * cp; }
};
BatchLayout batch_layout(const RunConfig& cfg, int world);

// Throws ConfigError on batch.global_batch unless it splits evenly over the layout.
void check_global_batch(int64_t global_batch, const BatchLayout& layout);
// Micro-batches each rank runs per optimizer step.
int64_t accumulation_steps(int64_t global_batch, const BatchLayout& layout);

}  // namespace tide
