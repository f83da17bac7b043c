// Cross-entropy rows, one block a row: an online max and sum of exponentials over the
// vocabulary, then (for the gradient) softmax minus the one-hot target written in place.
// An uncounted row (kUncountedTarget) has loss 0 and a zero gradient, and reads nothing.
// Each thread keeps its own running max and sum with one exponential an element (a new
// maximum rescales the sum), merged across the block at the end; rows of whole 16-byte
// packs are read and written a pack at a time.
#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 512;

// Adds logit v to the running (max, sum of exp(x - max)). A NaN reaches the sum (the
// loss is NaN, which the anomaly checks see); -inf adds nothing, also before any finite
// value (exp(-inf - -inf) would be NaN).
__device__ __forceinline__ void add_logit(MaxSum& m, float v) {
  if (v > m.max) {
    m.sum = m.sum * __expf(m.max - v) + 1.0f;
    m.max = v;
  } else if (v != -INFINITY) {
    m.sum += __expf(v - m.max);
  }
}

template <typename T>
__device__ __forceinline__ T gradient_of(T logit, float max, float inv_sum, bool target) {
  const float p = __expf(to_float(logit) - max) * inv_sum;
  return from_float<T>(target ? p - 1.0f : p);
}

template <typename T, bool kPacked>
__global__ void cross_entropy_rows_kernel(T* __restrict__ logits, const int64_t* __restrict__ targets,
                                          float* __restrict__ loss, int64_t vocab, bool gradient) {
  constexpr int V = Pack<T>::kSize;
  __shared__ float scratch_max[kWarp];
  __shared__ float scratch_sum[kWarp];
  const int64_t row = blockIdx.x;
  T* l = logits + row * vocab;
  const int64_t target = targets[row];
  if (target == kUncountedTarget) {  // the whole block takes this branch: no barrier is split
    if (threadIdx.x == 0) loss[row] = 0.0f;
    if (!gradient) return;
    const T zero = from_float<T>(0.0f);
    if (kPacked) {
      Pack<T> p;
#pragma unroll
      for (int k = 0; k < V; ++k) p.v[k] = zero;
      for (int64_t c = threadIdx.x * static_cast<int64_t>(V); c < vocab; c += static_cast<int64_t>(blockDim.x) * V)
        store_pack(l + c, p);
    } else {
      for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) l[c] = zero;
    }
    return;
  }
  MaxSum mine{-INFINITY, 0.0f};
  if (kPacked) {
    for (int64_t c = threadIdx.x * static_cast<int64_t>(V); c < vocab; c += static_cast<int64_t>(blockDim.x) * V) {
      const Pack<T> p = load_pack(l + c);
#pragma unroll
      for (int k = 0; k < V; ++k) add_logit(mine, to_float(p.v[k]));
    }
  } else {
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) add_logit(mine, to_float(l[c]));
  }
  const MaxSum all = block_max_sum(mine, scratch_max, scratch_sum);
  // A target outside the vocabulary gives a NaN loss (the anomaly checks see it), never
  // a read outside the row.
  const bool valid = target >= 0 && target < vocab;
  const float target_logit = valid ? to_float(l[target]) : NAN;
  __syncthreads();  // every thread has read the target's logit before it is overwritten
  if (threadIdx.x == 0) loss[row] = logf(all.sum) + all.max - target_logit;
  if (!gradient) return;
  const float inv_sum = 1.0f / all.sum;
  if (kPacked) {
    for (int64_t c = threadIdx.x * static_cast<int64_t>(V); c < vocab; c += static_cast<int64_t>(blockDim.x) * V) {
      Pack<T> p = load_pack(l + c);
#pragma unroll
      for (int k = 0; k < V; ++k) p.v[k] = gradient_of(p.v[k], all.max, inv_sum, c + k == target);
      store_pack(l + c, p);
    }
  } else {
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) l[c] = gradient_of(l[c], all.max, inv_sum, c == target);
  }
}

}  // namespace

void cross_entropy_rows(void* logits, const int64_t* targets, float* loss, int64_t rows, int64_t vocab, bool gradient,
                        Element e, cudaStream_t stream) {
  if (rows == 0) return;
  with_element(e, [&](auto t) {
    using T = decltype(t);
    auto* l = static_cast<T*>(logits);
    const auto blocks = static_cast<unsigned>(rows);
    if (vocab % Pack<T>::kSize == 0 && packable({logits}))
      launch(cross_entropy_rows_kernel<T, true>, blocks, kThreads, 0, stream, l, targets, loss, vocab, gradient);
    else
      launch(cross_entropy_rows_kernel<T, false>, blocks, kThreads, 0, stream, l, targets, loss, vocab, gradient);
  });
  check_launch("cross_entropy_rows");
}

}  // namespace tide::kernels
