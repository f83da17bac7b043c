// Model FLOPs and the machine's matmul peak, for MFU.
#pragma once

#include <cstdint>

#include "tide/engine/config.h"

namespace tide {

// Training FLOPs per token (forward + backward): 6 * matmul parameters (the output
// projection included, the embedding lookup not) + 12 * layers * dim * seq_len for
// the attention scores and values (PaLM's accounting; recomputation not counted).
double train_flops_per_token(const ModelConfig& m, int64_t seq_len);

// Best matmul throughput (FLOP/s) of this process' threads on `device` ("cpu" here)
// in the run's compute dtype, from a short probe of square GEMMs.
double measure_matmul_peak(const char* device = "cpu", DType dtype = DType::Float32);

}  // namespace tide
