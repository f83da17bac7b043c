// The weight gradients of tide's matmul nodes (projection, normed_projections,
// glu_down) and of the fused loss's head, summed in fp32.
#pragma once

#include <ATen/core/Tensor.h>

namespace tide {

// acc += a b, acc in fp32 (fp64) and a, b possibly in a narrower compute dtype: on CUDA
// inside the GEMM (cuBLAS writes an fp32 result from bf16 inputs, LibTorch >= 2.9), else
// the product then a sum into acc. With `overwrite`, acc = a b: acc's contents are not
// read (an empty acc needs no zeroing pass first).
void add_product(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, bool overwrite = false);

// The gradient a b of `weight`. Where the weight is a leaf whose .grad is already there in
// its own dtype (a training run's flat fp32 buffer, llm.c's and Megatron's main_grad), the
// product is summed straight into it and the result is undefined: autograd then adds
// nothing, and the gradient never exists in the compute dtype nor as a second fp32 copy
// (on an H200, S2's cast and add of each weight's gradient took about 5 ms a step). Its
// accumulator still runs, with every hook on it. Otherwise the product in the weight's
// dtype, which autograd accumulates.
at::Tensor weight_gradient(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b);

// The same for a gradient made already, `g` in fp32 (fp64) times the upstream gradient
// `scale` (a scalar tensor): summed into the weight's .grad in one pass where it is there
// (undefined result), else g scaled in place (g is the caller's to give up: no second
// [V, D] buffer) in the weight's dtype.
at::Tensor scaled_weight_gradient(const at::Tensor& weight, const at::Tensor& g, const at::Tensor& scale);

}  // namespace tide
