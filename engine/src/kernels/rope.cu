// Rotary embedding, one thread a pair (i, i + Hd/2) of one head at one position.
#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 256;

// Forward: (a, b) -> (a c_i - b s_i, b c_j + a s_j) for i < half, j = i + half; inverse
// (the transpose, for backward): (a c_i + b s_j, b c_j - a s_i).
template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, const T* __restrict__ cos, const T* __restrict__ sin,
                            T* __restrict__ y, RopeShape s, bool inverse) {
  const int64_t half = s.head_dim / 2;
  const int64_t pairs = s.batch * s.heads * s.tokens * half;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = p % half;
    int64_t rest = p / half;
    const int64_t t = rest % s.tokens;
    rest /= s.tokens;
    const int64_t h = rest % s.heads;
    const int64_t b = rest / s.heads;
    const T* xr = x + b * s.x_stride[0] + h * s.x_stride[1] + t * s.x_stride[2];
    T* yr = y + b * s.y_stride[0] + h * s.y_stride[1] + t * s.y_stride[2];
    const T* cr = cos + t * s.head_dim;
    const T* sr = sin + t * s.head_dim;
    const float a = to_float(xr[i]), bv = to_float(xr[i + half]);
    const float ci = to_float(cr[i]), cj = to_float(cr[i + half]);
    const float si = to_float(sr[i]), sj = to_float(sr[i + half]);
    if (!inverse) {
      yr[i] = from_float<T>(a * ci - bv * si);
      yr[i + half] = from_float<T>(bv * cj + a * sj);
    } else {
      yr[i] = from_float<T>(a * ci + bv * sj);
      yr[i + half] = from_float<T>(bv * cj - a * si);
    }
  }
}

}  // namespace

void rope(const void* x, const void* cos, const void* sin, void* y, const RopeShape& shape, bool inverse, Element e,
          cudaStream_t stream) {
  const int64_t pairs = shape.batch * shape.heads * shape.tokens * (shape.head_dim / 2);
  if (pairs == 0) return;
  with_element(e, [&](auto t) {
    using T = decltype(t);
    rope_kernel<T><<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(y), shape,
        inverse);
  });
  check_launch("rope");
}

}  // namespace tide::kernels
