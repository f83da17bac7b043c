// What tide's kernels share: element conversion, block reductions, launch checks.
#pragma once

// TIDE_CUDA_EMULATION: compiled as C++ for the CPU (tests/kernels/cuda_emulation.h).
#ifdef TIDE_CUDA_EMULATION
#include "cuda_emulation.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "fused_kernels.h"

namespace tide::kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half(v);
}

constexpr int kWarp = 32;

// 16 bytes of elements, moved in one load or store: an elementwise kernel that reads its
// bf16 two bytes a thread at a time reaches a third of the memory bandwidth (seen on an
// H200: SwiGLU, RoPE and RMSNorm at 3-5x their bytes' time).
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  Pack<T> r;
  *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
  return r;
}

// One 16-byte store through CUDA's store intrinsic: a plain uint4 assignment was split by
// nvcc into four 4-byte stores in RoPE's 64-bit-index kernel (its PTX), which the
// 32-bit one stored whole.
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& r) {
  __stwb(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&r));
}

// Whether every pointer is 16-byte aligned: where one is not, kernels take their
// element-at-a-time path.
inline bool packable(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// The sum over a warp's lanes; every lane gets it.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum over a block's threads (blockDim.x a multiple of 32, at most 1024); every
// thread gets it. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// A running (max, sum of exp(x - max)) pair, merged as the online softmax does.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

__device__ __forceinline__ MaxSum block_max_sum(MaxSum v, float* scratch_max, float* scratch_sum) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o)};
    v = merge(v, other);
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  __syncthreads();
  if (lane == 0) {
    scratch_max[warp] = v.max;
    scratch_sum[warp] = v.sum;
  }
  __syncthreads();
  v = lane < warps ? MaxSum{scratch_max[lane], scratch_sum[lane]} : MaxSum{-INFINITY, 0.0f};
  for (int o = kWarp / 2; o > 0; o /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o)};
    v = merge(v, other);
  }
  return v;
}

// kernel<<<grid, block, shared, stream>>>(args...), written once so that the emulation's
// launch can stand in for it.
#ifdef TIDE_CUDA_EMULATION
using cuda_emulation::launch;
#define TIDE_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::tide::cuda_emulation::dynamic_shared())
#else
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream, A&&... args) {
  kernel<<<grid, block, shared, stream>>>(static_cast<P>(args)...);
}
#define TIDE_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(kernel) + ": " + cudaGetErrorString(e));
}

inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
}

// Calls f(T{}) with T the element type e names.
template <typename F>
void with_element(Element e, F&& f) {
  switch (e) {
    case Element::F32:
      f(float{});
      return;
    case Element::BF16:
      f(__nv_bfloat16{});
      return;
    case Element::F16:
      f(__half{});
      return;
  }
}

}  // namespace tide::kernels
