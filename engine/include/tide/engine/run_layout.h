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
// does not divide).
void check_supported_layout(const RunConfig& cfg, int world);

// Sequences per micro-batch: batch.micro_batch, or derived from parallel.micro_batches.
int64_t micro_batch_size(const RunConfig& cfg, int dp);

}  // namespace tide
