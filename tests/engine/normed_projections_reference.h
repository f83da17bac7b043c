// What normed_projections' backward gives the norm's inputs, made from the public ops:
// the fused_ops and cuda_kernels tests compare the node with it bit for bit.
#pragma once

#include <vector>

#include <torch/csrc/autograd/autograd.h>
#include <torch/types.h>

#include "tide/engine/model/fused_ops.h"

namespace tide {

// The gradients of the norm's inputs (x, its weight, and a LayerNorm's bias) when its
// output's gradient is the projections' input gradients summed as the node sums them in
// the compute dtype: the last projection's product, then each earlier one's added by the
// GEMM (addmm_: the product added as it is written, rounded once). `up` is the gradient
// of the projections' outputs side by side; the weights are fp32, cast as working_copy
// casts them.
inline std::vector<torch::Tensor> norm_gradients_of_gemm_sum(const torch::Tensor& x, const NormWeights& norm,
                                                             const std::vector<torch::Tensor>& weights,
                                                             const torch::Tensor& up) {
  std::vector<torch::Tensor> in{x.detach().requires_grad_(), norm.weight.detach().requires_grad_()};
  if (norm.layer_norm) in.push_back(norm.bias.detach().requires_grad_());
  const auto y = norm.layer_norm ? layer_norm(in[0], in[1], in[2], norm.eps) : rms_norm(in[0], in[1], norm.eps);
  std::vector<int64_t> firsts{0};
  for (const auto& w : weights) firsts.push_back(firsts.back() + w.size(0));
  torch::Tensor dy;
  for (size_t k = weights.size(); k-- > 0;) {
    const int64_t width = firsts[k + 1] - firsts[k];
    const auto g = up.narrow(-1, firsts[k], width).reshape({-1, width});
    const auto w = weights[k].to(y.scalar_type());
    dy = dy.defined() ? dy.addmm_(g, w) : g.mm(w);
  }
  return torch::autograd::grad({y}, in, {dy.view(y.sizes())});
}

}  // namespace tide
