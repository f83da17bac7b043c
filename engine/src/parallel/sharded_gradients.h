// ZeRO gradients: the moment backward has produced every gradient of a unit, the
// unit's gradients are reduce-scattered, so each rank ends with the sum over ranks of
// its own piece while backward goes on. Collectives start in one order on every rank:
// each backward's units in the order its caller gives (the order backward completes
// them), and a unit that completes early waits for the ones before it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include <torch/types.h>

#include "gradient_hooks.h"
#include "tide/engine/optim/flat_parameters.h"

namespace tide {

class Comm;
class PendingCollective;

class ShardedGradients {
 public:
  enum class Mode {
    // ZeRO-1: gradients accumulate in the whole flat gradient buffer over micro-batches;
    // in the last one each unit is reduce-scattered into this rank's piece of it.
    InPlace,
    // ZeRO-2/3: no whole gradient buffer. In every micro-batch each unit's gradients
    // are copied into a buffer of the unit's size that lives until the unit is
    // reduce-scattered; the result is added into shard().
    Transient,
  };

  // on_unit_done(unit): backward has produced all of the unit's gradients (ZeRO-3
  // frees the unit's parameters then).
  ShardedGradients(Comm& dp, FlatParameters& flat, Mode mode, std::function<void(int)> on_unit_done = {});
  ~ShardedGradients();

  // Before each backward pass, with the units it produces gradients for (every unit,
  // or a pipeline chunk's) in the order it completes them. `reduce`: whether they are
  // reduced during this pass (InPlace: their last pass of the step; Transient: any
  // pass). A unit never given to a reducing pass keeps its gradients in the parameters'
  // .grad until finish() (tied embeddings summed across pipeline stages first).
  void begin_backward(bool reduce, const std::vector<int>& units);
  // After the last backward of a step: reduces the units no pass reduced, in index
  // order from the last, and waits for everything. Returns how many of the units that
  // hold parameters here started their reduction during backward.
  int finish();
  int units_held() const;

  // Transient: this rank's pieces of all units, end to end (FlatParameters
  // shard_segments with local gradients). InPlace: undefined.
  torch::Tensor& shard() { return shard_; }
  int64_t peak_transient_bytes() const { return peak_transient_bytes_; }

  void on_ready(size_t slot);  // the autograd hook

 private:
  struct Inflight;
  void complete_unit(int unit);
  void launch_in_order();
  void launch(int unit);
  void collect_leftover(int unit);
  void retire_oldest();
  void settle();

  Comm& dp_;
  FlatParameters& flat_;
  Mode mode_;
  std::function<void(int)> on_unit_done_;
  GradientHooks hooks_;
  std::vector<int64_t> local_offset_;  // unit → offset of this rank's piece in shard_
  std::vector<int> pending_init_, pending_;
  std::vector<char> ready_;
  std::vector<char> armed_;               // units whose gradients this pass reduces
  std::vector<char> reduced_;             // units launched in this step
  std::vector<int> order_;                // this step's launch order so far
  size_t next_ = 0;                       // position in it
  std::vector<torch::Tensor> unit_grad_;  // Transient: per-unit buffers while alive
  std::vector<std::unique_ptr<Inflight>> inflight_;
  torch::Tensor shard_;
  int64_t transient_bytes_ = 0, peak_transient_bytes_ = 0;
  std::mutex mu_;
};

}  // namespace tide
