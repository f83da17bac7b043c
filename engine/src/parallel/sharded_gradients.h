// ZeRO gradients: the moment backward has produced every gradient of a unit, the
// unit's gradients are reduce-scattered, so each rank ends with the sum over ranks of
// its own piece while backward goes on. Collectives start in one fixed order on every
// rank (units from last to first, backward's natural order); a unit that completes
// early waits for the ones before it in that order.
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

  // Before each micro-batch's backward; `reduce`: whether this backward's gradients
  // are reduced (InPlace: the last micro-batch only; Transient: always).
  void begin_backward(bool reduce);
  // After the last backward of a step: starts what is left, waits for everything.
  void finish();

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
  std::vector<torch::Tensor> unit_grad_;  // Transient: per-unit buffers while alive
  std::vector<std::unique_ptr<Inflight>> inflight_;
  torch::Tensor shard_;
  size_t next_ = 0;  // position in the launch order (units n-1 … 0)
  bool armed_ = false;
  int64_t transient_bytes_ = 0, peak_transient_bytes_ = 0;
  std::mutex mu_;
};

}  // namespace tide
