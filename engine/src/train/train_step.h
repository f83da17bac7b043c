// One optimizer step on this rank, whatever the layout made of the model (internal): the
// micro-batches forward and backward through the whole model or this pipeline stage, the
// gradients reduced over the data-parallel ranks and clipped, then the update.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tide/engine/config.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/loss_scaler.h"
#include "tide/engine/parallel/parallelize.h"
#include "tide/engine/train/trainer.h"

namespace tide {

class MicroBatchLosses;
class TokenSplit;

// A step's loss and gradient norm where the device left them: fp64 scalars, the same on
// every rank, read by the host a step later (StepReadout).
struct StepValues {
  at::Tensor loss;        // mean over the step's counted targets, all micro-batches and ranks
  at::Tensor grad_norm;   // global, before clipping (fp16: of the unscaled gradients)
  at::Tensor loss_scale;  // fp16: the scale the step's backward used (fp32); undefined otherwise
  // model.moe_experts: the blocks' mean load balance (1 when balanced) over the step's
  // micro-batches and ranks; undefined otherwise.
  at::Tensor moe_balance;
  // model.moe_experts: the busiest expert's share of its block's (token, choice) pairs
  // over the even share, in the worst block, over the step's whole batch (1: even).
  at::Tensor moe_max_load;
  // model.moe_z_loss: the blocks' mean router z statistic, mean(logsumexp(logits)^2), over
  // the step's micro-batches and ranks; undefined otherwise.
  at::Tensor moe_z;
  // model.moe_capacity_factor: the share of the step's (token, choice) pairs the experts'
  // capacity dropped, over every block, micro-batch and rank; undefined otherwise.
  at::Tensor moe_dropped;
};

class TrainStep {
 public:
  // `batch` and `dp_rank`: this rank's place in the job's batch layout. `tap` may be
  // empty (every loss as computed).
  TrainStep(ParallelModel& pm, Distributed* dist, const RunConfig& cfg, const BatchLayout& batch, int64_t dp_rank,
            LossTap tap);

  // Forward and backward of `batches` (this rank's micro-batches of 0-based step `step`),
  // the gradients reduced over the data-parallel ranks. Nothing here waits for the device.
  StepValues forward_backward(int64_t step, const std::vector<Batch>& batches);
  // The learning rate of the next update(), written to the optimizer's device without
  // waiting for it: a captured update (CUDA graphs) reads it there at each replay.
  void set_lr(double lr);
  // The update with the gradients forward_backward left, clipped or skipped as `gate`
  // says (ZeRO: then every rank gathers the updated pieces); fp16 divides the loss scale
  // out and moves it by the step's `grad_norm` (LossScaler).
  void update(const UpdateGate& gate, const at::Tensor& grad_norm);
  LossScaler& loss_scaler() { return scaler_; }
  // Mean validation loss over `batches` micro-batches of `split`, shared among the
  // data-parallel ranks; the same on every rank.
  double validation_loss(const TokenSplit& split, int64_t batches);

 private:
  // What each micro-batch's loss weighs in the step's (data.eod_mask_loss: by its counted
  // targets).
  MicroBatchLosses shares_of(const std::vector<Batch>& batches) const;
  // The total of `losses`; each backward of the micro-batch's part of it. loss_scale: fp16's,
  // multiplying each part before backward; undefined: none.
  at::Tensor whole_model(const std::vector<Batch>& batches, MicroBatchLosses& losses, const at::Tensor& loss_scale,
                         const std::function<void(int64_t, int)>& before_backward,
                         const std::function<at::Tensor(int64_t, at::Tensor)>& on_loss);
  // Under model.moe_experts: the step's statistics of the blocks (balance, z, pairs routed
  // and dropped, loads) summed over the pipeline stages and the data-parallel ranks in one
  // exchange of each; `out`'s means and shares set from them. Returns each expert's loads
  // [n_layers, E] over the step's whole batch.
  at::Tensor sum_moe_statistics(StepValues& out, int64_t accum, const at::TensorOptions& options);
  // Summed over the pipeline stages (the loss lives on the last; each stage's blocks
  // report their own), any shape.
  at::Tensor across_stages(const at::Tensor& x);

  ParallelModel& pm_;
  Distributed* dist_;
  const RunConfig& cfg_;
  LossTap tap_;
  BatchLayout batch_;
  int64_t dp_rank_ = 0;
  // Per chunk of this rank's model (one without a pipeline): the flat units its backward
  // reduces over the data-parallel ranks as it goes. Embeddings tied across pipeline
  // stages are summed over the two stages after backward, and reduced after that.
  std::vector<std::vector<int>> backward_units_;
  at::Tensor lr_;  // fp64 scalar on the optimizer's device
  // model.moe_expert_bias: the step's [n_layers, E] loads, the whole batch's, from
  // forward_backward to update().
  at::Tensor moe_loads_;
  LossScaler scaler_;
};

}  // namespace tide
