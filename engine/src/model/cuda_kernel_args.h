// The arguments of tide's CUDA kernels (src/kernels/fused_kernels.h) taken from tensors,
// for the sources that launch them. Empty in a build without the kernels.
#pragma once

#include "cuda_kernels_config.h"

#ifdef TIDE_CUDA_KERNELS
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>

#include "fused_kernels.h"

namespace tide {

inline kernels::Element element_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return kernels::Element::F32;
    case at::kBFloat16: return kernels::Element::BF16;
    case at::kHalf: return kernels::Element::F16;
    default: TORCH_CHECK(false, "tide's CUDA kernels take fp32, bf16 or fp16, not ", t.scalar_type());
  }
}

inline cudaStream_t stream_of(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace tide
#endif
