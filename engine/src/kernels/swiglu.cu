// SwiGLU's elementwise part, forward and backward, grid-stride over the elements.
#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + __expf(-v)); }

template <typename T>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                      int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]);
    out[i] = from_float<T>(g * sigmoid(g) * to_float(up[i]));
  }
}

// silu(g) = g s with s = sigmoid(g); silu'(g) = s (1 + g (1 - s)).
template <typename T>
__global__ void swiglu_backward_kernel(const T* __restrict__ d_out, const T* __restrict__ gate,
                                       const T* __restrict__ up, T* __restrict__ d_gate, T* __restrict__ d_up,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]), u = to_float(up[i]), d = to_float(d_out[i]);
    const float s = sigmoid(g);
    d_gate[i] = from_float<T>(d * u * s * (1.0f + g * (1.0f - s)));
    d_up[i] = from_float<T>(d * g * s);
  }
}

}  // namespace

void swiglu_forward(const void* gate, const void* up, void* out, int64_t n, Element e, cudaStream_t stream) {
  if (n == 0) return;
  with_element(e, [&](auto t) {
    using T = decltype(t);
    swiglu_forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(const void* d_out, const void* gate, const void* up, void* d_gate, void* d_up, int64_t n,
                     Element e, cudaStream_t stream) {
  if (n == 0) return;
  with_element(e, [&](auto t) {
    using T = decltype(t);
    swiglu_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(d_out), static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(d_gate),
        static_cast<T*>(d_up), n);
  });
  check_launch("swiglu_backward");
}

}  // namespace tide::kernels
