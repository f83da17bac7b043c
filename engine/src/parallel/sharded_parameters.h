// ZeRO-3 parameters: each rank keeps only its piece of every unit. A unit's whole
// parameters exist just while its block runs: all-gathered before its forward (the
// next unit's gather already in flight), freed after, gathered again before its
// backward and freed once its gradients are in. The last block and the head, whose
// backward follows at once, stay from their forward. The embeddings go after the token
// lookup, whose backward reads no weight, unless the tied head or the embedding norm
// reads them later: then they stay for the micro-batch. Parameters stay ordinary leaf
// tensors whose storage is allocated and freed underneath them, so autograd's saved
// tensors see the gathered values again in backward.
//
// Under bf16 (fp16) compute the pieces travel in that dtype, as DeepSpeed's and FSDP's
// (param_dtype) do: half the bytes of every gather. Each rank casts its fp32 piece of a
// unit for each gather; a gathered unit's parameters hold the fp32 values of the cast pieces,
// so every product multiplies by the same bf16 weights as without ZeRO-3 (its working copy
// casts exactly), while norm weights and biases read the rounded values, as the peers'
// do. Saving gathers the fp32 pieces themselves (gather_exact).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "tide/engine/model/parameter_units.h"
#include "tide/engine/optim/flat_parameters.h"

namespace tide {

class Comm;
class PendingCollective;

class ShardedParameters : public ParameterUnits {
 public:
  // Places the parameters: this rank's pieces get their first values
  // (flat.write_initial_values, which for a model built as shapes draws just those
  // elements) and nothing whole is made. `flat` is the layout, without buffers.
  // `wire`: the dtype the pieces are gathered in for forward and backward (float, or the
  // compute dtype).
  // `units`: how the flat units map to the model.
  ShardedParameters(Comm& dp, FlatParameters& flat, const ParameterUnitLayout& units, at::ScalarType wire);
  ~ShardedParameters() override;

  // This rank's pieces of all units, end to end: what the optimizer updates.
  torch::Tensor& shard() { return shard_; }

  void before_forward(int unit) override;
  at::Tensor after_forward(int unit, const at::Tensor& y) override;
  void before_backward(int unit) override;
  void end_forward() override;

  // The unit's gradients are in: its parameters can go.
  void release(int unit);
  // Every rank: the unit whole in fp32, from the pieces themselves (to save it), until
  // release(unit).
  void gather_exact(int unit);
  void release_all();
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }

 private:
  void gather(int unit);                        // whole when it returns
  void prefetch(int unit, bool exact = false);  // started, not waited for; exact: in fp32
  void allocate(int unit);
  void count(int64_t bytes);
  void drop_wire_buffer(int unit);

  Comm& dp_;
  int last_block_ = 0;
  bool keep_embeddings_ = false;  // through a micro-batch: read after the lookup
  torch::Tensor shard_;
  std::vector<int64_t> local_offset_;
  std::vector<torch::Tensor> whole_;  // per unit; storage freed while released
  at::ScalarType wire_;
  std::vector<torch::Tensor> wire_whole_;  // per unit, while its gather in the wire dtype runs
  std::vector<std::unique_ptr<PendingCollective>> gathering_;
  std::vector<char> gathered_;
  int64_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
};

}  // namespace tide
