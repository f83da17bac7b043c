// RMSNorm forward and backward. Where a row is whole 16-byte packs of at most
// kMaxLanePacks per lane, one warp takes a row (no block-wide barrier; the row's
// reduction is the warp's shuffle) and moves it 16 bytes a lane at a time; otherwise one
// block a row (forward) or a range of rows (backward), an element at a time.
#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int64_t kMaxPartials = 1024;
// The packs of a row one lane keeps the weight gradient of in registers (backward):
// rows of up to 32 x 8 x 8 = 2048 bf16 (1024 fp32) elements take the warp path.
constexpr int kMaxLanePacks = 8;

// The fp32 weights of one pack of V elements, V / 4 16-byte loads: V 4-byte ones (lanes
// 4V bytes apart) made each of a warp's loads touch 32 sectors for 128 bytes, per pack
// and per pass, more L1 traffic than the rows' own. The warp path takes a 16-byte-aligned
// w (the fused ops make it so, norms.cpp).
template <int V>
__device__ __forceinline__ void load_weights(const float* __restrict__ w, int c, float (&out)[V]) {
  static_assert(V % 4 == 0, "a pack is whole float4s of weights");
#pragma unroll
  for (int q = 0; q < V / 4; ++q) {
    const float4 f = *reinterpret_cast<const float4*>(w + c + 4 * q);
    out[4 * q] = f.x;
    out[4 * q + 1] = f.y;
    out[4 * q + 2] = f.z;
    out[4 * q + 3] = f.w;
  }
}

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

template <typename T>
__global__ void rms_norm_forward_warp(const T* __restrict__ x, const float* __restrict__ w, T* __restrict__ y,
                                      float* __restrict__ rstd, int64_t rows, int cols, float eps) {
  constexpr int V = Pack<T>::kSize;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / kWarp;
  if (row >= rows) return;  // a whole warp: no shuffle is left waiting
  const int lane = threadIdx.x % kWarp;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float squares = 0.0f;
  for (int c = lane * V; c < cols; c += kWarp * V) {
    const Pack<T> p = load_pack(xr + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = to_float(p.v[k]);
      squares += v * v;
    }
  }
  const float r = rsqrtf(warp_sum(squares) / static_cast<float>(cols) + eps);
  if (lane == 0) rstd[row] = r;
  for (int c = lane * V; c < cols; c += kWarp * V) {
    const Pack<T> p = load_pack(xr + c);
    float wk[V];
    load_weights(w, c, wk);
    Pack<T> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(to_float(p.v[k]) * r * wk[k]);
    store_pack(yr + c, o);
  }
}

// Rows [first, last) of this block: dx for each, and the weight gradient's sum over them
// in shared memory (each thread owns its columns), written to dw_partial[blockIdx.x].
template <typename T>
__global__ void rms_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ rstd, const T* __restrict__ dx_add,
                                         T* __restrict__ dx, float* __restrict__ dw_partial, int64_t rows, int64_t cols,
                                         int64_t rows_per_block) {
  TIDE_DYNAMIC_SHARED(float, dw);  // [cols]
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
    const T* addr = dx_add ? dx_add + row * cols : nullptr;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xn = to_float(xr[c]) * r;
      const float d = r * (to_float(dyr[c]) * w[c] - xn * mean_dot);
      dxr[c] = from_float<T>(addr ? d + to_float(addr[c]) : d);
    }
  }
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dw_partial[blockIdx.x * cols + c] = dw[c];
}

// The same per warp: warp w of the block takes rows first + w, first + w + kWarps, ...;
// each lane sums the weight gradient of its packs (lane, lane + 32, ...) in registers,
// and the block's warps add theirs into shared memory one after another. P: the packs a
// lane holds at most, the fewest that cover the row, so that a narrow row keeps fewer
// registers (8 packs of bf16 take about 120 a thread, a quarter of the SM's warps).
template <typename T, int P>
__global__ void __launch_bounds__(kThreads, P <= 4 ? 3 : 2)
    rms_norm_backward_warp(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ w,
                           const float* __restrict__ rstd, const T* __restrict__ dx_add, T* __restrict__ dx,
                           float* __restrict__ dw_partial, int64_t rows, int cols, int64_t rows_per_block) {
  constexpr int V = Pack<T>::kSize;
  TIDE_DYNAMIC_SHARED(float, dw);  // [cols]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  float mine[P][V];
#pragma unroll
  for (int j = 0; j < P; ++j)
#pragma unroll
    for (int k = 0; k < V; ++k) mine[j][k] = 0.0f;
  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (int64_t row = first + warp; row < last; row += kWarps) {
    const T* dyr = dy + row * cols;
    const T* xr = x + row * cols;
    const float r = rstd[row];
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int c = (lane + j * kWarp) * V;
      if (c >= cols) break;
      const Pack<T> xp = load_pack(xr + c), gp = load_pack(dyr + c);
      float wk[V];
      load_weights(w, c, wk);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xn = to_float(xp.v[k]) * r, g = to_float(gp.v[k]);
        dot += g * wk[k] * xn;
        mine[j][k] += g * xn;
      }
    }
    const float mean_dot = warp_sum(dot) / static_cast<float>(cols);
    T* dxr = dx + row * cols;
    const T* addr = dx_add ? dx_add + row * cols : nullptr;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int c = (lane + j * kWarp) * V;
      if (c >= cols) break;
      const Pack<T> xp = load_pack(xr + c), gp = load_pack(dyr + c);
      float wk[V];
      load_weights(w, c, wk);
      float d[V];
#pragma unroll
      for (int k = 0; k < V; ++k) d[k] = r * (to_float(gp.v[k]) * wk[k] - to_float(xp.v[k]) * r * mean_dot);
      if (addr) {
        const Pack<T> ap = load_pack(addr + c);
#pragma unroll
        for (int k = 0; k < V; ++k) d[k] += to_float(ap.v[k]);
      }
      Pack<T> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(d[k]);
      store_pack(dxr + c, o);
    }
  }
  for (int c = threadIdx.x; c < cols; c += blockDim.x) dw[c] = 0.0f;
  for (int turn = 0; turn < kWarps; ++turn) {
    __syncthreads();
    if (warp != turn) continue;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int c = (lane + j * kWarp) * V;
      if (c >= cols) break;
#pragma unroll
      for (int k = 0; k < V; ++k) dw[c + k] += mine[j][k];
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < cols; c += blockDim.x) dw_partial[blockIdx.x * static_cast<int64_t>(cols) + c] = dw[c];
}

// Whether rows of `cols` elements take the warp kernels.
template <typename T>
bool warp_rows(int64_t cols, std::initializer_list<const void*> pointers) {
  constexpr int V = Pack<T>::kSize;
  return cols % V == 0 && cols <= static_cast<int64_t>(kWarp) * V * kMaxLanePacks && packable(pointers);
}

}  // namespace

int64_t rms_norm_partials(int64_t rows) { return rows < kMaxPartials ? (rows > 0 ? rows : 1) : kMaxPartials; }

void rms_norm_forward(const void* x, const float* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps,
                      Element e, cudaStream_t stream) {
  if (rows == 0) return;
  with_element(e, [&](auto t) {
    using T = decltype(t);
    const auto* xs = static_cast<const T*>(x);
    auto* ys = static_cast<T*>(y);
    if (warp_rows<T>(cols, {x, w, y})) {
      const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
      launch(rms_norm_forward_warp<T>, blocks, kThreads, 0, stream, xs, w, ys, rstd, rows, static_cast<int>(cols), eps);
    } else {
      launch(rms_norm_forward_kernel<T>, static_cast<unsigned>(rows), kThreads, 0, stream, xs, w, ys, rstd, cols, eps);
    }
  });
  check_launch("rms_norm_forward");
}

void rms_norm_backward(const void* dy, const void* x, const float* w, const float* rstd, const void* dx_add, void* dx,
                       float* dw_partial, int64_t rows, int64_t cols, Element e, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t partials = rms_norm_partials(rows);
  const int64_t rows_per_block = (rows + partials - 1) / partials;
  const size_t shared = static_cast<size_t>(cols) * sizeof(float);
  with_element(e, [&](auto t) {
    using T = decltype(t);
    const auto* dys = static_cast<const T*>(dy);
    const auto* xs = static_cast<const T*>(x);
    auto* dxs = static_cast<T*>(dx);
    const auto* adds = static_cast<const T*>(dx_add);
    if (warp_rows<T>(cols, {dy, x, w, dx}) && (!dx_add || packable({dx_add}))) {
      const int64_t lane_packs = (cols + kWarp * Pack<T>::kSize - 1) / (kWarp * Pack<T>::kSize);
      auto kernel = lane_packs <= 1   ? rms_norm_backward_warp<T, 1>
                    : lane_packs <= 2 ? rms_norm_backward_warp<T, 2>
                    : lane_packs <= 4 ? rms_norm_backward_warp<T, 4>
                                      : rms_norm_backward_warp<T, kMaxLanePacks>;
      launch(kernel, static_cast<unsigned>(partials), kThreads, shared, stream, dys, xs, w, rstd, adds, dxs, dw_partial,
             rows, static_cast<int>(cols), rows_per_block);
      return;
    }
    auto kernel = rms_norm_backward_kernel<T>;
    if (shared > 48 * 1024)
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    launch(kernel, static_cast<unsigned>(partials), kThreads, shared, stream, dys, xs, w, rstd, adds, dxs, dw_partial,
           rows, cols, rows_per_block);
  });
  check_launch("rms_norm_backward");
}

}  // namespace tide::kernels
