// Data parallelism over the flat parameter and gradient buffers, by ZeRO stage:
//   0: every rank holds everything; gradients all-reduced in buckets during backward.
//   1: optimizer state sharded: each rank owns one piece of every unit (see
//      FlatParameters), reduce-scatters gradients into its pieces during the last
//      backward, updates them, and all ranks gather the updated pieces.
//   2: also gradients: each micro-batch's gradients are reduce-scattered unit by unit
//      as backward produces them, and a rank keeps only its pieces.
//   3: also parameters: a unit exists whole only while its block runs.
// Optimizer offload moves the owned master pieces and moments to host memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tide/engine/config.h"
#include "tide/engine/optim/flat_parameters.h"

namespace tide {

class AdamW;
class Comm;
class ParameterUnits;
struct ParameterUnitLayout;
class ShardedGradients;
class ShardedParameters;

class DataParallel {
 public:
  // How the trainer must lay out FlatParameters for this stage and group size.
  static FlatParameters::Options flat_options(const ParallelConfig& cfg, int ranks);

  // `flat` laid out with flat_options(cfg, dp.size()), before any forward pass.
  // `compute`: the run's resolved compute dtype; under bf16 (fp16) stage 3 gathers
  // parameters in it (sharded_parameters.h). `units`: how `flat`'s units map to the
  // model (parameter_names.h), which stage 3 follows to hold each no longer than needed.
  // `model_parallel`: the groups of ranks that hold the other parts of this rank's
  // model replica (tensor parallel, pipeline stages); the gradient norm adds their parts.
  // `read_in_compute_dtype`: the parameters the model reads only as their working copy
  // (transformer.h: weights_read_in_compute_dtype), which stage 3 holds gathered in the
  // compute dtype alone; empty: none. `frozen`: under LoRA, the frozen base's layout
  // (FlatParameters::Options::frozen, no buffers), which stage 3 shards and gathers unit
  // by unit beside the adapters; null: the model holds its frozen weights whole.
  DataParallel(Comm& dp, FlatParameters& flat, const ParallelConfig& cfg, DType compute,
               const ParameterUnitLayout& units, std::vector<Comm*> model_parallel = {},
               const std::function<bool(const std::string&)>& read_in_compute_dtype = {},
               const FlatParameters* frozen = nullptr);
  ~DataParallel();

  // Expert parallelism: the reducer of this rank's experts (their own flat buffers, over
  // the ranks that hold the same experts, the expert-parallel group among its
  // model-parallel ones), driven with this one from now on: begin_backward, zero_grad,
  // gather_parameters, hold_whole and release_whole reach both, reduce_gradients averages
  // the experts' gradients over this group's `mean_over` ranks (each expert saw tokens of
  // all of them) and returns the norm of both, parameter_units and the byte counts speak
  // for both. Each keeps its own optimizer (make_optimizer).
  void join_experts(std::unique_ptr<DataParallel> experts);

  // ZeRO-3: what the model must call around each unit (Transformer::set_parameter_units);
  // otherwise null.
  ParameterUnits* parameter_units();
  // ZeRO-3 with a frozen layout: this rank's pieces of the frozen base, end to end (where
  // a checkpoint's restore writes them); otherwise undefined.
  torch::Tensor frozen_shard();

  // Before each backward pass (a micro-batch's, or its pass through one pipeline chunk),
  // with the flat units it produces gradients for, in the order it completes them
  // (pipeline_stage.h: chunk_units), and whether it is their last pass of the step.
  // A unit's gradients are reduced during its last pass (stages 0 and 1; stage 0 from
  // its second step, once the ranks agreed on the order in which buckets complete) or
  // during every pass (stages 2 and 3). A unit never given, or never as `last`, is
  // reduced in reduce_gradients(): one whose gradients must first be summed elsewhere
  // (embeddings tied across pipeline stages).
  void begin_backward(bool last, const std::vector<int>& units);
  // After the last backward: finishes the reduction, averages over the group and
  // returns the global L2 norm of the gradients (over the model-parallel parts too) as an
  // fp64 scalar on their device, never read here: summed piece by piece in one order for
  // every stage, so that all stages give the same bits.
  torch::Tensor reduce_gradients();
  void zero_grad();
  // The optimizer over what this rank owns.
  std::unique_ptr<AdamW> make_optimizer(const OptimConfig& optim, bool offload);
  // After the optimizer step: stages 1 and 2 gather the updated pieces on all ranks.
  void gather_parameters();
  // Every rank of the group calls them, for the same units in the same order: unit
  // `unit`'s trained parameters whole in fp32 from hold_whole until release_whole (stage 3
  // gathers its exact pieces, whatever dtype forward gathers in; other stages hold every
  // parameter whole already). One unit at a time is how a sharded model is saved; a
  // LoRA base is not gathered, its values are its initial ones (final_weights.h).
  void hold_whole(int unit);
  void release_whole(int unit);

  // Sum over the group of a scalar (losses for reporting) or of a tensor of statistics
  // (elementwise, in fp64, its shape kept): on the device, or read on the host.
  torch::Tensor sum(const torch::Tensor& x);
  double sum(double x);
  // What this rank holds between steps (param_bytes: of the flat buffer, and under
  // stage 3 of a LoRA base too, its pieces in the dtype they are held in).
  int64_t param_bytes() const;
  int64_t grad_bytes() const;
  // The most this rank held at once of parameters gathered and gradients waiting to
  // be reduced (stages 2 and 3), beyond the bytes above.
  int64_t peak_transient_bytes() const;
  int64_t bytes_sent() const;

 private:
  struct Buckets;
  void scale_gradients(double factor);
  torch::Tensor squared_norm_of_pieces(int rank);
  torch::Tensor model_parallel_sum(torch::Tensor norm2);
  torch::Tensor reduce_own_gradients();
  Comm& dp_;
  int mean_over_ = 0;  // the ranks the gradients are a mean over; 0: the group's
  std::unique_ptr<DataParallel> experts_;
  std::vector<Comm*> model_parallel_;
  FlatParameters& flat_;
  ParallelConfig cfg_;
  std::unique_ptr<Buckets> buckets_;          // stage 0
  struct BothUnits;
  std::unique_ptr<ShardedParameters> params_;         // stage 3
  std::unique_ptr<ShardedParameters> frozen_params_;  // stage 3 under LoRA
  std::unique_ptr<BothUnits> both_units_;             // drives params_ and frozen_params_
  std::unique_ptr<BothUnits> with_experts_;           // drives this one's units and experts_'
  std::unique_ptr<ShardedGradients> grads_;    // stages 1-3
  bool reported_overlap_ = false;
};

}  // namespace tide
