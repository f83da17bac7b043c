// The arguments of tide's CUDA kernels (src/kernels/fused_kernels.h) taken from tensors,
// for the sources that launch them. Empty in a build without the kernels.
#pragma once

#include "cuda_kernels_config.h"

// TIDE_LAUNCHES_KERNELS: the fused ops and AdamW call tide's kernels, on CUDA tensors (a
// CUDA build, TIDE_CUDA_KERNELS) or, in the tests' emulation build (TIDE_CUDA_EMULATION,
// tests/kernels), on the CPU's tensors while an EmulatedKernelsScope is open (train/'s
// CUDA graphs exist only on CUDA: TIDE_CUDA_KERNELS).
#if defined(TIDE_CUDA_EMULATION) || defined(TIDE_CUDA_KERNELS)
#define TIDE_LAUNCHES_KERNELS 1
#include <cstdint>

#include <ATen/core/Tensor.h>
#ifndef TIDE_CUDA_EMULATION
#include <ATen/cuda/CUDAContext.h>
#endif

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

// t where its data starts at a 16-byte boundary, else a copy that does (the caching
// allocator's blocks do): for a small tensor a kernel reads in 16-byte loads, such as a
// norm's weight, a view into the flat buffer at any offset.
inline at::Tensor aligned_to_16_bytes(const at::Tensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.const_data_ptr()) % 16 == 0 ? t : t.clone();
}

#ifdef TIDE_CUDA_EMULATION
inline bool on_kernel_device(const at::Tensor& t) { return t.is_cpu() && cuda_emulation::kernels_take_cpu_tensors(); }
inline cudaStream_t stream_of(const at::Tensor&) { return nullptr; }
#else
inline bool on_kernel_device(const at::Tensor& t) { return t.is_cuda(); }
inline cudaStream_t stream_of(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

}  // namespace tide
#endif
