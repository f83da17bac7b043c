// All parameters of a model in one contiguous fp32 buffer, with the gradients in a
// second one; every parameter and its .grad become views into them (as llm.c does).
// One buffer makes the optimizer a handful of vectorised ops, gradient clipping one
// norm, and sharding (ZeRO) a matter of offsets. Parameters that require no gradient
// (frozen: the base weights under LoRA) are left out and stay the model's own tensors,
// unless a layout of their own is asked for (Options::frozen).
//
// The buffer is cut into units (the model's blocks, and one unit for everything
// outside them), each padded to a multiple of the data-parallel size: ZeRO gives rank r
// the r-th equal piece of every unit, so a unit's gradients are reduce-scattered and
// its parameters all-gathered as one contiguous range, as soon as its block is done.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "tide/engine/config.h"

namespace tide {

// A range the optimizer updates: `numel` elements at param_offset in its parameter
// buffer and at grad_offset in its gradient buffer, with or without weight decay, and
// counted or not by this rank in the global gradient norm.
struct OptimSegment {
  int64_t param_offset = 0, grad_offset = 0, numel = 0;
  bool decayed = false, counted = true;
};

class FlatParameters {
 public:
  struct Slot {
    std::string name;
    int unit = 0;
    int64_t offset = 0, numel = 0;  // in the whole (padded) flat index space
    std::vector<int64_t> shape;
    bool decayed = false, counted = true;
    torch::Tensor param;
  };
  // Within a unit: decayed parameters first, each group with its counted parameters
  // first, so that both properties are constant over four ranges.
  struct Unit {
    int64_t offset = 0, numel = 0;  // numel: padded to a multiple of pad_to
    int64_t decay_numel = 0;
    int64_t counted_decay_numel = 0, counted_plain_numel = 0;
    std::vector<size_t> slots;
  };
  struct Options {
    int64_t pad_to = 1;
    // Unit of a parameter name (units are laid out in index order); empty: one unit.
    std::function<int(const std::string&)> unit_of;
    // Whether this rank counts a parameter in the global gradient norm (empty: all).
    // False for a parameter that ranks of another model-parallel group hold as well
    // (norms under tensor parallelism): one of them counts it.
    std::function<bool(const std::string&)> counted;
    // Which of the (trained, or frozen) parameters this layout holds; empty: all. Under
    // expert parallelism a rank's experts are laid out apart from the rest, which other
    // ranks reduce and shard them with.
    std::function<bool(const std::string&)> takes;
    // Whether to allocate the whole parameter / gradient buffers and make parameters
    // and their .grad views of them (ZeRO-2 holds no whole gradient, ZeRO-3 neither).
    bool data = true, grad = true;
    // Lay out the parameters that require no gradient instead (LoRA's frozen base, which
    // ZeRO-3 shards as it shards the trained ones); `grad` must then be false.
    bool frozen = false;
    // Writes elements [first, first + into.numel()) of a parameter's first values (in
    // row-major order) into `into`, their place in a flat buffer or a ZeRO-3 piece (1-D,
    // on `device`). Empty: the parameter's own values are copied. A model built as
    // shapes alone (transformer.h: ParameterStorage::Deferred) is placed through it, so
    // its values exist only where they will stay. Called while the buffers are made
    // (here and by ZeRO-3's ShardedParameters), not after.
    std::function<void(const std::string& name, const torch::Tensor& into, int64_t first)> initial_values;
    // Where the buffers live; empty: where the parameters are.
    std::optional<c10::Device> device;
  };

  FlatParameters(torch::nn::Module& model, const OptimConfig& optim, Options options);
  FlatParameters(torch::nn::Module& model, const OptimConfig& optim) : FlatParameters(model, optim, Options{}) {}

  torch::Tensor& data() { return data_; }  // undefined unless Options::data
  torch::Tensor& grad() { return grad_; }  // undefined unless Options::grad
  int64_t numel() const { return numel_; }  // padded
  int64_t pad_to() const { return pad_to_; }
  c10::Device device() const { return device_; }
  // Options::initial_values of `slot` from element `first` into `into`.
  void write_initial_values(const Slot& slot, const torch::Tensor& into, int64_t first = 0) const;
  const std::vector<Slot>& slots() const { return slots_; }
  const std::vector<Unit>& units() const { return units_; }
  void zero_grad();

  // The optimizer's ranges over the whole buffers, split where weight decay changes.
  std::vector<OptimSegment> segments() const;
  // Rank `rank` of `ranks`' piece of every unit. Parameter offsets index the whole
  // buffer (`local_params` false) or the rank's pieces laid end to end (true);
  // gradient offsets likewise with `local_grads`.
  std::vector<OptimSegment> shard_segments(int rank, int ranks, bool local_params, bool local_grads) const;
  // Elements of one rank's pieces of all units.
  int64_t shard_numel(int ranks) const { return numel_ / ranks; }

 private:
  torch::Tensor data_, grad_;
  int64_t numel_ = 0, pad_to_ = 1;
  c10::Device device_{c10::kCPU};
  std::function<void(const std::string&, const torch::Tensor&, int64_t)> initial_values_;
  std::vector<Slot> slots_;
  std::vector<Unit> units_;
};

}  // namespace tide
