// All parameters of a model in one contiguous fp32 buffer, with the gradients in a
// second one; every parameter and its .grad become views into them (as llm.c does).
// One buffer makes the optimizer a handful of vectorised ops, gradient clipping one
// norm, and later sharding (ZeRO) a matter of offsets.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "tide/engine/config.h"

namespace tide {

class FlatParameters {
 public:
  struct Slot {
    std::string name;
    int64_t offset = 0, numel = 0;
    std::vector<int64_t> shape;
    bool decayed = false;
    torch::Tensor param;
  };

  // Decayed parameters come first, so weight decay applies to one prefix [0, decay_numel).
  // The buffers are zero-padded to a multiple of `pad_to` elements (equal ZeRO shards).
  FlatParameters(torch::nn::Module& model, const OptimConfig& optim, int64_t pad_to = 1);

  torch::Tensor& data() { return data_; }
  torch::Tensor& grad() { return grad_; }
  int64_t numel() const { return data_.numel(); }  // padded
  int64_t parameter_numel() const { return parameter_numel_; }
  int64_t decay_numel() const { return decay_numel_; }
  const std::vector<Slot>& slots() const { return slots_; }
  void zero_grad() { grad_.zero_(); }

 private:
  torch::Tensor data_, grad_;
  int64_t decay_numel_ = 0, parameter_numel_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace tide
