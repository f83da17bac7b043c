// The sum of a step's micro-batch losses, kept on the losses' device and read once: reading
// each loss as it comes would make the host wait for the device at every micro-batch.
#pragma once

#include <ATen/core/Tensor.h>

namespace tide {

class LossSum {
 public:
  void add(const at::Tensor& loss);  // a scalar; summed in fp64, as the host would
  double value() const;              // 0 when nothing was added; waits for the device
 private:
  at::Tensor sum_;
};

}  // namespace tide
