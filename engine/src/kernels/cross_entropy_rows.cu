// Cross-entropy rows, one block a row: an online max and sum of exponentials over the
// vocabulary, then (for the gradient) softmax minus the one-hot target written in place.
#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 512;

template <typename T>
__global__ void cross_entropy_rows_kernel(T* __restrict__ logits, const int64_t* __restrict__ targets,
                                          float* __restrict__ loss, int64_t vocab, bool gradient) {
  __shared__ float scratch_max[kWarp];
  __shared__ float scratch_sum[kWarp];
  const int64_t row = blockIdx.x;
  T* l = logits + row * vocab;
  MaxSum mine{-INFINITY, 0.0f};
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) mine = merge(mine, MaxSum{to_float(l[c]), 1.0f});
  const MaxSum all = block_max_sum(mine, scratch_max, scratch_sum);
  // A target outside the vocabulary gives a NaN loss (the anomaly checks see it), never
  // a read outside the row.
  const int64_t target = targets[row];
  const bool valid = target >= 0 && target < vocab;
  const float target_logit = valid ? to_float(l[target]) : NAN;
  __syncthreads();  // every thread has read the target's logit before it is overwritten
  if (threadIdx.x == 0) loss[row] = logf(all.sum) + all.max - target_logit;
  if (!gradient) return;
  const float inv_sum = 1.0f / all.sum;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float p = __expf(to_float(l[c]) - all.max) * inv_sum;
    l[c] = from_float<T>(c == target ? p - 1.0f : p);
  }
}

}  // namespace

void cross_entropy_rows(void* logits, const int64_t* targets, float* loss, int64_t rows, int64_t vocab, bool gradient,
                        Element e, cudaStream_t stream) {
  if (rows == 0) return;
  with_element(e, [&](auto t) {
    using T = decltype(t);
    cross_entropy_rows_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(logits), targets, loss, vocab, gradient);
  });
  check_launch("cross_entropy_rows");
}

}  // namespace tide::kernels
