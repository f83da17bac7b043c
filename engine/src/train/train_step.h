// One optimizer step on this rank, whatever the layout made of the model (internal): the
// micro-batches forward and backward through the whole model or this pipeline stage, the
// gradients reduced over the data-parallel ranks and clipped, then the update.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tide/engine/config.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/parallel/parallelize.h"
#include "tide/engine/train/trainer.h"

namespace tide {

class TokenSplit;

struct StepLoss {
  double loss = 0;       // mean over the step's micro-batches and ranks
  double grad_norm = 0;  // global, before clipping; the same on every rank
};

class TrainStep {
 public:
  // `batch` and `dp_rank`: this rank's place in the job's batch layout. `tap` may be
  // empty (every loss as computed).
  TrainStep(ParallelModel& pm, Distributed* dist, const RunConfig& cfg, const BatchLayout& batch, int64_t dp_rank,
            LossTap tap);

  // Forward and backward of `batches` (this rank's micro-batches of 0-based step `step`),
  // gradients reduced and clipped to grad_clip (0: not clipped).
  StepLoss forward_backward(int64_t step, const std::vector<Batch>& batches, double grad_clip);
  // The update with the gradients forward_backward left (ZeRO: then every rank gathers
  // the updated pieces).
  void update(double lr);
  // Mean validation loss over `batches` micro-batches of `split`, shared among the
  // data-parallel ranks; the same on every rank.
  double validation_loss(const TokenSplit& split, int64_t batches);

 private:
  // The sum of the micro-batch losses; each backward of loss / micro-batches.
  double whole_model(const std::vector<Batch>& batches, const std::function<void(int64_t)>& before_backward,
                     const std::function<at::Tensor(int64_t, at::Tensor)>& on_loss);
  double across_stages(double x);  // the loss lives on the last pipeline stage

  ParallelModel& pm_;
  Distributed* dist_;
  const RunConfig& cfg_;
  LossTap tap_;
  BatchLayout batch_;
  int64_t dp_rank_ = 0;
  // With tied embeddings across stages the gradients are summed after backward, so no
  // data-parallel reduction may start during it.
  bool overlap_last_backward_ = true;
};

}  // namespace tide
