// Pipeline parallelism: this rank runs one stage of the model (pipeline_stage.h) on a
// step's micro-batches, receiving activations from the previous stage and gradients
// from the next one, point to point over the pipeline group, in the order of
// pipeline_schedule.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tide/engine/config.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/parallel/pipeline_schedule.h"

namespace tide {

class MicroBatchLosses;

class Comm;

class Pipeline {
 public:
  // activation: the shape passed between stages, [micro_batch, T (/ tp with sequence
  // parallelism), dim], in the compute dtype (the residual stream's: bf16 halves the
  // bytes between stages and changes no value, fp32 otherwise). tied_embeddings: the group of the first and the last
  // stage when they share the embeddings (null on the stages between, or untied); their gradients are summed over it
  // after each step's backward.
  Pipeline(Comm& pp, Transformer model, std::string schedule, std::vector<int64_t> activation, DType compute,
           Comm* tied_embeddings = nullptr);

  // One step: forward and backward of every micro-batch (each stage is given them all;
  // the first uses the tokens, the last the targets). On the last stage on_loss(m, loss)
  // gives the loss to use for micro-batch m (a test's fault injection; else the loss
  // itself), whose part of the step's (`losses`) is scaled by gradient_scale (fp16's
  // loss scale on the device, where defined) before backward. before_backward(m, chunk)
  // runs before each backward pass, micro-batch m's through one of the stage's chunks.
  // Returns the total of `losses` on the last stage, 0 elsewhere: an fp64 scalar on the
  // stage's device, not read here.
  at::Tensor train(const std::vector<Batch>& batches, MicroBatchLosses& losses, const at::Tensor& gradient_scale,
                   const std::function<void(int64_t, int)>& before_backward,
                   const std::function<at::Tensor(int64_t, at::Tensor)>& on_loss);
  // Forward only (no grad): the batch's loss on the last stage, 0 elsewhere.
  double forward_loss(const Batch& batch);

 private:
  Comm& pp_;
  Transformer model_;
  std::string schedule_;
  std::vector<int64_t> activation_;
  DType compute_;
  Comm* tied_embeddings_;
  torch::TensorOptions wire_;  // activations and their gradients between stages, on the model's device
  int64_t eval_tag_ = 0;
};

}  // namespace tide
