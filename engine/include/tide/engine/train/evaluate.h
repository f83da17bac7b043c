// Validation loss and text generation with a trained model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tide/engine/data/batch_loader.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/model/transformer.h"

namespace tide {

// Mean next-token loss over the counted targets of n_batches evenly spaced batches of the
// split (no grad). `contents`: what the batches hold, as the run's data config makes them
// (documents apart, uncounted document ends).
double evaluate_loss(Transformer& model, const TokenSplit& split, int64_t seq_len, int64_t micro_batch,
                     int64_t n_batches, const BatchContents& contents = {});

// Validation batches' losses, each batch's mean weighing as its counted targets: summed
// over ranks part by part, then divided.
struct EvalLosses {
  double weighted = 0;  // sum of each batch's mean loss times its counted targets
  double counted = 0;   // sum of the batches' counted targets
  double mean() const { return counted > 0 ? weighted / counted : 0.0; }
};
// The losses of batches first, first + step, ... < n_batches: data-parallel ranks each
// take a share and add up. `compute`: the dtype the forward runs in, as in training
// (validation measures the model that trains).
EvalLosses evaluate_losses(Transformer& model, const TokenSplit& split, int64_t seq_len, int64_t micro_batch,
                           int64_t n_batches, int64_t first, int64_t step, DType compute,
                           const BatchContents& contents);
// The same with the loss of a batch computed by `loss_of` (a pipeline's forward: 0 on
// the stages before the last, whose counts are the last's all the same), the mean over
// the targets `loss_targets` keeps of a batch's (Transformer::loss_targets).
EvalLosses sum_eval_losses(const std::function<double(const Batch&)>& loss_of,
                           const std::function<at::Tensor(const at::Tensor&)>& loss_targets, const TokenSplit& split,
                           int64_t seq_len, int64_t micro_batch, int64_t n_batches, int64_t first, int64_t step,
                           const BatchContents& contents);

// Entropy (nats) of the split's unigram token distribution: the loss of a model that
// knows only token frequencies, the baseline a trained model must beat.
double unigram_entropy(const TokenSplit& split);

struct SampleOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;
  int32_t stop_id = -1;      // stop after emitting this id (end-of-text)
  int32_t end_of_turn_id = -1;  // or this one (a chat template's end of an assistant's turn)
};

// Continues `prompt`; calls on_token with each new id as it is chosen.
std::vector<int32_t> sample(Transformer& model, const std::vector<int32_t>& prompt, const SampleOptions& opt,
                            const std::function<void(int32_t)>& on_token = {});

}  // namespace tide
