// Model FLOPs and the machine's matmul peak, for MFU.
#pragma once

#include <cstdint>

#include "tide/engine/config.h"

namespace tide {

// Training FLOPs per token (forward + backward): 6 * matmul parameters (the output
// projection included, the embedding lookup not) + 12 * width * counted_keys summed over
// the layers for the attention scores and values (PaLM's accounting; recomputation not
// counted).
double train_flops_per_token(const ModelConfig& m, int64_t seq_len);

// The keys a query of layer `layer` (from 0) is counted against: seq_len where it attends
// in full (PaLM counts causal attention as if every query saw every key), and where it
// attends over a window w shorter than the sequence T, that scaled as the keys the window
// leaves causal attention: T (w (w + 1) / 2 + (T - w) w) / (T (T + 1) / 2). So a windowed
// layer's MFU is not counted for the work its window skips.
double counted_keys(const ModelConfig& m, int64_t layer, int64_t seq_len);

// Best matmul throughput (FLOP/s) of this process' threads on `device` ("cpu" here)
// in the run's compute dtype, from a short probe of square GEMMs.
double measure_matmul_peak(const char* device = "cpu", DType dtype = DType::Float32);

}  // namespace tide
