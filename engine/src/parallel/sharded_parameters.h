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
// unit for each gather, and the gathered unit is held in that dtype, as FSDP2 holds it:
// a weight that is only ever multiplied (the model says which: read_in_compute_dtype)
// never exists in fp32 on a rank, its gathered bf16 values serve as its working copy
// (compute_dtype.h: keep_working_copies), so a gathered block costs 2 bytes a weight and
// no cast in forward or backward. The others (embeddings, norms, biases) are widened into
// fp32 tensors of their own, holding the rounded values, as the peers' do. Every product
// multiplies by the same bf16 weights as without ZeRO-3 (its working copy rounds the
// same fp32 values). Saving gathers the fp32 pieces themselves (gather_exact).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
  // elements) and nothing whole is made. `flat` is the layout, without buffers; it
  // outlives this. `wire`: the dtype the pieces are gathered in for forward and backward
  // (float, or the compute dtype). `units`: how the flat units map to the model.
  // `read_in_compute_dtype(name)`: whether every read of a parameter in forward and
  // backward is of its working copy in the compute dtype (transformer.h); empty: none is.
  //
  // `frozen`: the parameters have no gradients (LoRA's base), so none says when a unit's
  // backward is over; a unit goes when backward reaches the unit below it (its input's
  // gradient is complete then), the embeddings and the lowest block of the pass at
  // release_all(), after the step's last backward. Its shard is held in `wire` (every
  // gather would round it alike; nothing updates it), so gather_exact has nothing exact
  // to gather under bf16.
  ShardedParameters(Comm& dp, const FlatParameters& flat, const ParameterUnitLayout& units, at::ScalarType wire,
                    const std::function<bool(const std::string&)>& read_in_compute_dtype = {}, bool frozen = false);
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
  struct Unit;
  void gather(int unit);                        // whole when it returns
  void prefetch(int unit, bool exact = false);  // started, not waited for; exact: in fp32
  void hold_in_wire_dtype(Unit& unit);
  void count(Unit& unit, int64_t bytes);

  Comm& dp_;
  const FlatParameters& flat_;
  int last_block_ = 0;
  bool keep_embeddings_ = false;  // through a micro-batch: read after the lookup
  bool frozen_ = false;
  at::ScalarType wire_;
  torch::Tensor shard_;
  std::vector<Unit> units_;
  int64_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
};

}  // namespace tide
