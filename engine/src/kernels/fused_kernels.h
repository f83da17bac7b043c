// tide's CUDA kernels, declared without LibTorch so that nvcc compiles them without its
// headers (model/fused_ops.cpp calls them on CUDA tensors). Every pointer is device
// memory; `x` rows are contiguous; each call is queued on `stream` and returns at once.
// The element type is that of the activations (fp32, bf16 or fp16); arithmetic is fp32.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tide::kernels {

enum class Element { F32, BF16, F16 };

// y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps) (fp32, kept for backward);
// w is fp32 [cols].
void rms_norm_forward(const void* x, const float* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps,
                      Element e, cudaStream_t stream);
// dx = rstd * (dy w - x rstd^2 mean(dy w x)) per row, and the weight's gradient as
// partial sums over row ranges: dw_partial [rms_norm_partials(rows), cols] fp32, summed
// over its first dimension by the caller (deterministic, unlike atomics).
void rms_norm_backward(const void* dy, const void* x, const float* w, const float* rstd, void* dx, float* dw_partial,
                       int64_t rows, int64_t cols, Element e, cudaStream_t stream);
int64_t rms_norm_partials(int64_t rows);

// out = silu(gate) * up, and its backward: d_gate = d_out * up * silu'(gate),
// d_up = d_out * silu(gate). n elements, all contiguous.
void swiglu_forward(const void* gate, const void* up, void* out, int64_t n, Element e, cudaStream_t stream);
void swiglu_backward(const void* d_out, const void* gate, const void* up, void* d_gate, void* d_up, int64_t n,
                     Element e, cudaStream_t stream);

// Rotary embedding with Hugging Face's convention (the head dimension in halves,
// (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)) over x [B, H, T, Hd] with any strides for B, H
// and T and a contiguous head dimension; cos and sin are [T, Hd] contiguous, in x's
// element type. `inverse` rotates by -theta: the backward of the forward rotation.
struct RopeShape {
  int64_t batch, heads, tokens, head_dim;
  int64_t x_stride[3];  // of x's B, H, T, in elements
  int64_t y_stride[3];
};
void rope(const void* x, const void* cos, const void* sin, void* y, const RopeShape& shape, bool inverse, Element e,
          cudaStream_t stream);

// Cross-entropy of each row of logits [rows, vocab] (contiguous) against its target:
// loss[row] = logsumexp(logits[row]) - logits[row, target] in fp32. With `gradient`,
// the logits are overwritten in place with softmax(logits[row]) - one_hot(target), the
// gradient of the rows' summed loss. Two passes over the logits: an online max and sum
// of exponentials, then the gradient.
void cross_entropy_rows(void* logits, const int64_t* targets, float* loss, int64_t rows, int64_t vocab, bool gradient,
                        Element e, cudaStream_t stream);

}  // namespace tide::kernels
