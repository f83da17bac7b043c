// RMSNorm forward and backward, one block a row (forward) or a range of rows (backward).
#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxPartials = 1024;

template <typename T>
__global__ void rms_norm_forward_kernel(const T* __restrict__ x, const float* __restrict__ w, T* __restrict__ y,
                                        float* __restrict__ rstd, int64_t cols, float eps) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = to_float(xr[c]);
    squares += v * v;
  }
  const float r = rsqrtf(block_sum(squares, scratch) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = from_float<T>(to_float(xr[c]) * r * w[c]);
}

// Rows [first, last) of this block: dx for each, and the weight gradient's sum over them
// in shared memory (each thread owns its columns), written to dw_partial[blockIdx.x].
template <typename T>
__global__ void rms_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ rstd, T* __restrict__ dx,
                                         float* __restrict__ dw_partial, int64_t rows, int64_t cols,
                                         int64_t rows_per_block) {
  extern __shared__ float dw[];  // [cols]
  __shared__ float scratch[kWarp];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dw[c] = 0.0f;
  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (int64_t row = first; row < last; ++row) {
    const T* dyr = dy + row * cols;
    const T* xr = x + row * cols;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xn = to_float(xr[c]) * r;
      const float g = to_float(dyr[c]);
      dot += g * w[c] * xn;
      dw[c] += g * xn;
    }
    const float mean_dot = block_sum(dot, scratch) / static_cast<float>(cols);
    T* dxr = dx + row * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xn = to_float(xr[c]) * r;
      dxr[c] = from_float<T>(r * (to_float(dyr[c]) * w[c] - xn * mean_dot));
    }
  }
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dw_partial[blockIdx.x * cols + c] = dw[c];
}

}  // namespace

int64_t rms_norm_partials(int64_t rows) { return rows < kMaxPartials ? (rows > 0 ? rows : 1) : kMaxPartials; }

void rms_norm_forward(const void* x, const float* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps,
                      Element e, cudaStream_t stream) {
  if (rows == 0) return;
  with_element(e, [&](auto t) {
    using T = decltype(t);
    rms_norm_forward_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(x), w, static_cast<T*>(y), rstd, cols, eps);
  });
  check_launch("rms_norm_forward");
}

void rms_norm_backward(const void* dy, const void* x, const float* w, const float* rstd, void* dx, float* dw_partial,
                       int64_t rows, int64_t cols, Element e, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t partials = rms_norm_partials(rows);
  const int64_t rows_per_block = (rows + partials - 1) / partials;
  const size_t shared = static_cast<size_t>(cols) * sizeof(float);
  with_element(e, [&](auto t) {
    using T = decltype(t);
    auto kernel = rms_norm_backward_kernel<T>;
    if (shared > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    kernel<<<static_cast<unsigned>(partials), kThreads, shared, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), w, rstd, static_cast<T*>(dx), dw_partial, rows, cols,
        rows_per_block);
  });
  check_launch("rms_norm_backward");
}

}  // namespace tide::kernels
