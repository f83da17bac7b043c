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

// Refuses, naming the fields, a layout this engine cannot run on `world` ranks (the
// factors do not fit, the model cannot be cut, a combination not supported, a batch that
// does not divide, a profiled rank outside the job).
void check_supported_layout(const RunConfig& cfg, int world);

// Sequences per micro-batch: batch.micro_batch, or derived from parallel.micro_batches.
int64_t micro_batch_size(const RunConfig& cfg, int dp);

// How a step's batch is cut, fixed when a job starts: dp ranks, each running
// global_batch / (micro_batch * dp) micro-batches of micro_batch sequences. A live
// batch.global_batch keeps the micro-batch and changes the accumulation.
struct BatchLayout {
  int64_t dp = 1;
  int64_t micro_batch = 1;
};
BatchLayout batch_layout(const RunConfig& cfg, int world);

// Throws ConfigError on batch.global_batch unless it splits evenly over the layout.
void check_global_batch(int64_t global_batch, const BatchLayout& layout);
// Micro-batches each rank runs per optimizer step.
int64_t accumulation_steps(int64_t global_batch, const BatchLayout& layout);

}  // namespace tide
