// Model FLOPs and the machine's matmul peak, for MFU.
#pragma once

#include <cstdint>

#include "tide/engine/config.h"

namespace tide {

// Training FLOPs per token (forward + backward): 6 * matmul parameters (the output
// projection included, the embedding lookup not) + 12 * width * counted_keys summed over
// the layers for the attention scores and values (PaLM's accounting; recomputation not
// counted). Under LoRA a frozen matmul weight counts 4: its gradient is not computed.
double train_flops_per_token(const ModelConfig& m, int64_t seq_len);

// The keys a query of layer `layer` (from 0) is counted against: seq_len where it attends
// in full (PaLM counts causal attention as if every query saw every key), and where it
// attends over a window w shorter than the sequence T, that scaled as the keys the window
// leaves causal attention: T (w (w + 1) / 2 + (T - w) w) / (T (T + 1) / 2). So a windowed
// layer's MFU is not counted for the work its window skips.
double counted_keys(const ModelConfig& m, int64_t layer, int64_t seq_len);

// The keys attention as tide runs it (model/layers.cpp) computes a query of layer `layer`
// against, on average: what the planner times and pipeline stages are balanced by, where
// counted_keys is what MFU counts. A fused kernel with no mask skips the blocks above the
// diagonal (seq_len / 2); a mask (ALiBi's bias, `documents` apart) makes it compute every
// score, the masked ones too (seq_len); soft-capped attention reads each block of
// queries' keys up to its last query, mask or not (seq_len / 2); without a fused kernel
// (`fused` false) every score is computed (seq_len). A window w shorter than the sequence
// is attended in parts (model/attention_masks.h): about R + w keys a query past the
// first w, R = window_block_rows(w).
double computed_keys(const ModelConfig& m, int64_t layer, int64_t seq_len, bool documents, bool fused = true);

// Best matmul throughput (FLOP/s) of this process' threads on `device` ("cpu" here)
// in the run's compute dtype, from a short probe of square GEMMs.
double measure_matmul_peak(const char* device = "cpu", DType dtype = DType::Float32);

}  // namespace tide
