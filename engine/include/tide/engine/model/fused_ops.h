// The decoder's elementwise and normalisation ops as autograd nodes with hand-written
// backward passes that keep only what backward needs. On CUDA tensors, in a build against
// a CUDA LibTorch, each is one of tide's kernels (src/kernels); elsewhere LibTorch's ops
// compute the same formulas.
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tide {

// Whether tide's CUDA kernels take x: a CUDA build, x on a CUDA device, in fp32, bf16 or
// fp16.
bool fused_kernels_take(const at::Tensor& x);

// RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps) * weight, the statistics in
// fp32 (fp64 for fp64 x), the result in x's dtype. Keeps x and the per-row statistic.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// LayerNorm over the last dimension, in fp32 (fp64 for fp64 x) as autocast runs it on
// CUDA, the result in x's dtype. Keeps x in fp32 and the per-row mean and inverse
// deviation.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

// A gated MLP's activation: silu (SwiGLU: LLaMA, Mistral, Qwen) or gelu in its tanh
// form (GeGLU: Gemma).
enum class GateActivation { Silu, GeluTanh };

// A gated MLP's product act(gate) * up. Keeps gate and up (the unfused ops keep
// act(gate) too). The MLP takes glu_down, which also projects; this is the product alone,
// the form the CUDA kernel is checked in.
at::Tensor glu(const at::Tensor& gate, const at::Tensor& up, GateActivation act);

// act(gate) * up projected by weight [out, F] (no bias): the MLP's down projection.
// Keeps gate and up and the fp32 weight, not the product, which backward recomputes;
// computes in gate's dtype with the weight's working copy (compute_dtype.h), and adds
// the weight's gradient into its fp32 .grad where that is there (weight_gradient.h).
at::Tensor glu_down(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight, GateActivation act);

// x W^T + b, as at::linear under autocast, except that the weight's copy in the compute
// dtype is its working copy (compute_dtype.h: kept for the step under a WeightCastScope,
// otherwise made again in backward instead of kept from the forward) and its gradient is
// computed by the node, in fp32.
at::Tensor projection(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// A norm over the last dimension: RMSNorm (no bias), or LayerNorm (with one).
struct NormWeights {
  at::Tensor weight, bias;
  double eps = 1e-5;
  bool layer_norm = false;
};

// A projection x W^T + b (bias may be undefined).
struct ProjectionWeights {
  at::Tensor weight, bias;
};

// How a norm's output reaches column-parallel projections on other tensor-parallel
// ranks and its gradient comes back, with no autograd: `to_projections` makes what the
// projections read from the norm's output (sequence parallelism: the all-gather along
// the sequence; empty: the output itself), `from_projections` makes the gradient of the
// norm's output from the gradient of what they read (Megatron's f: the all-reduce;
// sequence parallelism: the reduce-scatter; empty: itself).
struct ProjectionExchange {
  std::function<at::Tensor(const at::Tensor&)> to_projections, from_projections;
};

// A norm of x and the projections that read its output (attention's q, k and v; the
// MLP's gate and up): what rms_norm or layer_norm, then projection of the output, give,
// the same bits, except that the norm's output is not kept for backward and that the
// projections' input gradients are summed by the GEMM (each product added as it is
// written, one rounding). Backward makes the output again from x (one elementwise pass,
// and with sequence parallelism the all-gather once more, as Megatron-LM gathers a
// column-parallel layer's input again), as torch.compile's partitioner recomputes it: the
// node keeps x as given and the fp32 weights (their working copies, compute_dtype.h, are
// what the projections multiply by), not the output the projections would each keep, nor
// the fp32 copy of a bf16 x the norm alone keeps on the host.
//
// With `residual_out`, one more output follows the projections: x itself, for the
// residual stream to read. Its gradient then reaches x through this node, added to the
// norm's in the pass that makes it, instead of in a pass of autograd's own.
std::vector<at::Tensor> normed_projections(const at::Tensor& x, const NormWeights& norm,
                                           const std::vector<ProjectionWeights>& projections,
                                           ProjectionExchange exchange = {}, bool residual_out = false);

// Rotary position embedding with Hugging Face's convention (halves of the head
// dimension): x * cos + rotate_half(x) * sin, for x [B, H, T, Hd] and cos, sin [T, Hd].
// Keeps nothing of x: backward rotates the gradient back.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The CUDA kernel behind the fused loss (linear_cross_entropy.cpp), where
// fused_kernels_take(logits): the loss of each row of logits [rows, V] against its target
// (fp32 [rows]) and, with `gradient`, softmax - one_hot(target) written over the logits;
// a row whose target is kUncountedTarget: loss 0, zeros written.
at::Tensor cross_entropy_rows_(at::Tensor& logits, const at::Tensor& targets, bool gradient);

}  // namespace tide
