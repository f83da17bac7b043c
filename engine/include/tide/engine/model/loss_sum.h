// The sum of a step's micro-batch losses, kept on the losses' device: reading each loss as
// it comes would make the host wait for the device at every micro-batch.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace tide {

class LossSum {
 public:
  void add(const at::Tensor& loss);  // a scalar; summed in fp64, as the host would
  // The sum, an fp64 scalar on the losses' device (0 on `device` when nothing was added);
  // not read here.
  at::Tensor total(c10::Device device) const;

 private:
  at::Tensor sum_;
};

}  // namespace tide
