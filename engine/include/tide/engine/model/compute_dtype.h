// The compute dtype of a forward pass (precision.compute).
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>

#include "tide/engine/config.h"

namespace tide {

// fn() with matmuls in the compute dtype (bf16: autocast on the host and on CUDA, its
// cast cache cleared after).
at::Tensor with_compute_dtype(DType compute, const std::function<at::Tensor()>& fn);

}  // namespace tide
