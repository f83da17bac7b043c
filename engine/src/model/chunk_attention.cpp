// A chunk's causal attention as two fused calls merged by log-sum-exp (chunk_attention.h).
#include "tide/engine/model/chunk_attention.h"

#include <array>
#include <tuple>

#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

namespace tide {
namespace {

enum class Kernel : int64_t { None, HostFlash, CudaFlash, CudaEfficient };

Kernel kernel_for(const at::Tensor& q) {
  const auto t = q.scalar_type();
  const int64_t hd = q.size(-1);
  if (q.device().is_cpu())
    return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf ? Kernel::HostFlash
                                                                                       : Kernel::None;
  if (q.device().is_cuda()) {
    // The widths each kernel takes (PyTorch's sdp_utils): flash up to 256, in whole
    // 8-element packs; memory-efficient fp32 in 4-element ones.
    if ((t == at::kBFloat16 || t == at::kHalf) && hd % 8 == 0 && hd <= 256) return Kernel::CudaFlash;
    if (t == at::kFloat && hd % 4 == 0 && hd <= 256) return Kernel::CudaEfficient;
  }
  return Kernel::None;
}

// One fused call: its output, its rows' log-sum-exp, and what its backward is given back.
struct Part {
  at::Tensor out;
  at::Tensor lse;  // [B, H, c]; CUDA's memory-efficient kernel pads c to a multiple of 32
  at::Tensor cum_q, cum_k, seed, offset;
  int64_t max_q = 0, max_k = 0;
};

Part attend(Kernel kernel, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale) {
  Part p;
  switch (kernel) {
    case Kernel::HostFlash:
      std::tie(p.out, p.lse) = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, {}, scale);
      break;
    case Kernel::CudaFlash: {
      auto r = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, causal, false, scale);
      p.out = std::get<0>(r);
      p.lse = std::get<1>(r);
      p.cum_q = std::get<2>(r);
      p.cum_k = std::get<3>(r);
      p.max_q = std::get<4>(r).expect_int();
      p.max_k = std::get<5>(r).expect_int();
      p.seed = std::get<6>(r);
      p.offset = std::get<7>(r);
      break;
    }
    case Kernel::CudaEfficient:
      std::tie(p.out, p.lse, p.seed, p.offset) =
          at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, true, 0.0, causal, scale);
      break;
    case Kernel::None: TORCH_CHECK(false, "chunk attention: no fused kernel for ", q.scalar_type(), " on ", q.device());
  }
  return p;
}

// The gradients of a part's q, k and v, given the merged output and log-sum-exp (`lse`
// [B, H, c], laid out as the part's own).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attend_backward(Kernel kernel, const at::Tensor& grad,
                                                               const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& v, const at::Tensor& out,
                                                               const at::Tensor& lse, const Part& p, bool causal,
                                                               double scale) {
  switch (kernel) {
    case Kernel::HostFlash:
      return at::_scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, 0.0, causal, {}, scale);
    case Kernel::CudaFlash:
      return at::_scaled_dot_product_flash_attention_backward(grad, q, k, v, out, lse, p.cum_q, p.cum_k, p.max_q,
                                                              p.max_k, 0.0, causal, p.seed, p.offset, scale);
    case Kernel::CudaEfficient: {
      auto padded = at::zeros_like(p.lse);
      padded.narrow(-1, 0, lse.size(-1)).copy_(lse);
      auto r = at::_scaled_dot_product_efficient_attention_backward(
          grad, q, k, v, at::Tensor(), out, padded, p.seed, p.offset, 0.0, {true, true, true, false}, causal, scale);
      return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
    }
    case Kernel::None: break;
  }
  TORCH_CHECK(false, "chunk attention: no fused kernel for ", q.scalar_type(), " on ", q.device());
}

// Autograd keeps a part's non-tensor results beside its tensors.
void save_part(torch::autograd::AutogradContext* ctx, const std::string& name, const Part& p) {
  ctx->saved_data[name + "_max_q"] = p.max_q;
  ctx->saved_data[name + "_max_k"] = p.max_k;
}

Part load_part(torch::autograd::AutogradContext* ctx, const std::string& name, const at::Tensor& lse,
               const at::Tensor& cum_q, const at::Tensor& cum_k, const at::Tensor& seed, const at::Tensor& offset) {
  Part p;
  p.lse = lse;
  p.cum_q = cum_q;
  p.cum_k = cum_k;
  p.seed = seed;
  p.offset = offset;
  p.max_q = ctx->saved_data[name + "_max_q"].toInt();
  p.max_k = ctx->saved_data[name + "_max_k"].toInt();
  return p;
}

struct ChunkAttentionFunction : torch::autograd::Function<ChunkAttentionFunction> {
  // Part "before": the chunk's queries over the keys before it, none masked; part
  // "own": over its own keys, causally (the kernels' causal: queries and keys start
  // together).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale) {
    const Kernel kernel = kernel_for(q);
    const int64_t c = q.size(2), before = k.size(2) - c;
    const Part early = attend(kernel, q, k.narrow(2, 0, before), v.narrow(2, 0, before), false, scale);
    const Part own = attend(kernel, q, k.narrow(2, before, c), v.narrow(2, before, c), true, scale);
    // The merged rows: softmax over all the keys is each part's softmax weighted by its
    // share exp(lse_part - lse) of the row's whole sum.
    const auto le = early.lse.narrow(-1, 0, c), lo = own.lse.narrow(-1, 0, c);
    const auto lse = at::logaddexp(le, lo);  // [B, H, c], fp32 (fp64 for fp64 inputs)
    const auto wide = lse.scalar_type();
    const auto out =
        (early.out.to(wide) * (le - lse).exp().unsqueeze(-1) + own.out.to(wide) * (lo - lse).exp().unsqueeze(-1))
            .to(q.scalar_type());
    ctx->save_for_backward({q, k, v, out, lse, early.lse, early.cum_q, early.cum_k, early.seed, early.offset, own.lse,
                            own.cum_q, own.cum_k, own.seed, own.offset});
    save_part(ctx, "early", early);
    save_part(ctx, "own", own);
    ctx->saved_data["kernel"] = static_cast<int64_t>(kernel);
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    const Part early = load_part(ctx, "early", s[5], s[6], s[7], s[8], s[9]);
    const Part own = load_part(ctx, "own", s[10], s[11], s[12], s[13], s[14]);
    const auto kernel = static_cast<Kernel>(ctx->saved_data["kernel"].toInt());
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t c = q.size(2), before = k.size(2) - c;
    const auto grad = grads[0].contiguous();
    const auto [dq_early, dk_early, dv_early] =
        attend_backward(kernel, grad, q, k.narrow(2, 0, before), v.narrow(2, 0, before), out, lse, early, false, scale);
    const auto [dq_own, dk_own, dv_own] =
        attend_backward(kernel, grad, q, k.narrow(2, before, c), v.narrow(2, before, c), out, lse, own, true, scale);
    return {dq_early + dq_own, at::cat({dk_early, dk_own}, 2), at::cat({dv_early, dv_own}, 2), at::Tensor()};
  }
};

}  // namespace

bool chunk_attention_supported(const at::Tensor& q) { return kernel_for(q) != Kernel::None; }

at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(0) == k.size(0) &&
                  q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 && k.size(2) >= q.size(2),
              "chunk attention of q ", q.sizes(), " over k ", k.sizes(), " and v ", v.sizes(),
              ": the keys must end with the queries' own, their heads divide the queries'");
  TORCH_CHECK(chunk_attention_supported(q), "chunk attention: no fused kernel for ", q.scalar_type(), " on ",
              q.device(), " at head width ", q.size(3));
  if (k.size(2) == q.size(2))
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale,
                                            /*enable_gqa=*/k.size(1) != q.size(1));
  if (kernel_for(q) == Kernel::CudaEfficient && k.size(1) != q.size(1)) {
    // CUDA's memory-efficient kernel reads a key head per query head (PyTorch's SDPA
    // repeats grouped keys for it too); autograd sums the repeats' gradients back.
    const int64_t groups = q.size(1) / k.size(1);
    return ChunkAttentionFunction::apply(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), scale);
  }
  return ChunkAttentionFunction::apply(q, k, v, scale);
}

}  // namespace tide
