// RMSNorm and LayerNorm over the last dimension as a forward and a backward function, for
// the autograd nodes that apply a norm: rms_norm alone, and a norm with the projections
// that read its output (fused_ops.h). RMSNorm runs tide's CUDA kernel where
// fused_kernels_take(x), LibTorch's ops elsewhere; LayerNorm is LibTorch's
// native_layer_norm in fp32, as autocast runs layer_norm.
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

namespace tide {

// What a norm's backward reads, as its forward made it.
struct NormState {
  at::Tensor x;             // the input the statistics were taken of, in their dtype (the kernel's: x's)
  at::Tensor weight, bias;  // in that dtype; bias undefined for RMSNorm
  at::Tensor mean, rstd;    // per row; mean undefined for RMSNorm
  at::ScalarType weight_dtype = at::kFloat, bias_dtype = at::kFloat;  // the parameters' own dtypes
};

struct NormGradients {
  at::Tensor x, weight, bias;  // bias undefined for RMSNorm; weight and bias in their dtypes
};

// y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps) per row, statistics in fp32
// (fp64 for fp64 x), y in x's dtype.
std::pair<at::Tensor, NormState> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps);

// y = (x - mean) * rstd * weight + bias, in fp32 (fp64 for fp64 x), y in x's dtype. bias
// may be undefined.
std::pair<at::Tensor, NormState> layer_norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                    const at::Tensor& bias, double eps);

// The gradients of a norm's input and parameters for dy, the gradient of its output. x's
// gradient is in the statistics' dtype (autograd casts it to the input's), or the
// kernel's; where dx_add is given (the gradient x gets from elsewhere: the residual
// stream's), it is added in before x's gradient is rounded, in the pass that makes it on
// CUDA.
NormGradients norm_backward(const at::Tensor& dy, const NormState& s, const at::Tensor& dx_add = {});

}  // namespace tide
