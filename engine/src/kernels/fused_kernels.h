// tide's CUDA kernels, declared without LibTorch so that nvcc compiles them without its
// headers (model/fused_ops.cpp calls them on CUDA tensors). Every pointer is device
// memory; `x` rows are contiguous; each call is queued on `stream` and returns at once.
// The element type is that of the activations (fp32, bf16 or fp16); arithmetic is fp32.
#pragma once

#include <cstdint>

#ifdef TIDE_CUDA_EMULATION
#include "cuda_emulation.h"
#else
#include <cuda_runtime_api.h>
#endif

namespace tide::kernels {

enum class Element { F32, BF16, F16 };

// y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps) (fp32, kept for backward);
// w is fp32 [cols].
void rms_norm_forward(const void* x, const float* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps,
                      Element e, cudaStream_t stream);
// dx = rstd * (dy w - x rstd^2 mean(dy w x)) + dx_add per row (dx_add may be null: the
// gradient x also gets from elsewhere, the residual stream's, summed before dx is
// rounded), and the weight's gradient as partial sums over row ranges: dw_partial
// [rms_norm_partials(rows), cols] fp32, summed over its first dimension by the caller
// (deterministic, unlike atomics).
void rms_norm_backward(const void* dy, const void* x, const float* w, const float* rstd, const void* dx_add, void* dx,
                       float* dw_partial, int64_t rows, int64_t cols, Element e, cudaStream_t stream);
int64_t rms_norm_partials(int64_t rows);

// A gated MLP's activation: SwiGLU's silu, GeGLU's gelu in its tanh form.
enum class Gate { Silu, GeluTanh };

// out = act(gate) * up, and its backward: d_gate = d_out * up * act'(gate),
// d_up = d_out * act(gate). n elements, all contiguous. d_gate may be d_out (written in
// place); `product` (may be null) receives out again, as glu_forward makes it, in the
// same pass: the down projection's weight gradient wants it, and it is not kept.
void glu_forward(Gate act, const void* gate, const void* up, void* out, int64_t n, Element e, cudaStream_t stream);
void glu_backward(Gate act, const void* d_out, const void* gate, const void* up, void* d_gate, void* d_up,
                  void* product, int64_t n, Element e, cudaStream_t stream);

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
// of exponentials, then the gradient. A row whose target is kUncountedTarget counts for
// nothing: loss 0 and, with `gradient`, zeros written over its logits.
inline constexpr int64_t kUncountedTarget = -100;
void cross_entropy_rows(void* logits, const int64_t* targets, float* loss, int64_t rows, int64_t vocab, bool gradient,
                        Element e, cudaStream_t stream);

// AdamW over ranges of flat fp32 buffers (params, grads, and the moments at their own
// offsets), one launch for all: a block takes one chunk of kAdamWChunk elements of a
// range. The step's scalars are device memory, read when the kernel runs (a captured
// update takes what was written there before each replay): lr, the step count including
// this step (the bias corrections), the factor that clips the gradients (null: 1) and a
// skip flag (null, or 0: the step is taken; else nothing is written). `working`, where
// not null, gets each updated parameter in `working_element` (bf16, fp16) at the
// parameter's offset: the weights' working copy, written in the same pass.
struct AdamWRange {
  int64_t param = 0, grad = 0, state = 0, numel = 0;  // offsets in elements
  bool decayed = false;
  bool packed = false;  // every address the range starts at 16-byte aligned and param % 4 == 0:
                        // 16 bytes a thread at a time
};
struct AdamWChunk {
  int64_t range = 0, first = 0, numel = 0;
};
constexpr int64_t kAdamWChunk = 1 << 16;
struct AdamWArgs {
  float* params = nullptr;
  const float* grads = nullptr;
  float *exp_avg = nullptr, *exp_avg_sq = nullptr;
  void* working = nullptr;
  Element working_element = Element::BF16;
  const float* lr = nullptr;
  const float* step = nullptr;
  const float* grad_factor = nullptr;
  const float* skip = nullptr;
  // The per-step factors are formed in double from these, as the host kernel's caller
  // forms them (optim/adamw.cpp), then rounded to fp32.
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
// The chunks of `ranges` (host memory) into `out` (host, may be null), and how many.
int64_t adamw_chunks(const AdamWRange* ranges, int64_t n_ranges, AdamWChunk* out);
// ranges and chunks in device memory, as adamw_chunks laid them out.
void adamw_update(const AdamWArgs& args, const AdamWRange* ranges, const AdamWChunk* chunks, int64_t n_chunks,
                  cudaStream_t stream);

}  // namespace tide::kernels
