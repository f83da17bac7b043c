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

// chunk_attention_forward's `saved`: the merged log-sum-exp, then each call's state
// (the keys before the chunk's, then its own keys'); `sizes`: the kernel, then each
// call's max_q and max_k.
constexpr size_t kStateTensors = 5;

void append_part(ChunkAttentionForward& f, const Part& p) {
  f.saved.insert(f.saved.end(), {p.lse, p.cum_q, p.cum_k, p.seed, p.offset});
  f.sizes.insert(f.sizes.end(), {p.max_q, p.max_k});
}

Part part_at(const std::vector<at::Tensor>& saved, const std::vector<int64_t>& sizes, size_t which) {
  TORCH_CHECK(saved.size() == 1 + 2 * kStateTensors && sizes.size() == 5,
              "chunk attention's backward given a state of ", saved.size(), " tensors and ", sizes.size(), " sizes");
  const size_t at = 1 + which * kStateTensors;
  Part p;
  p.lse = saved[at];
  p.cum_q = saved[at + 1];
  p.cum_k = saved[at + 2];
  p.seed = saved[at + 3];
  p.offset = saved[at + 4];
  p.max_q = sizes[1 + 2 * which];
  p.max_k = sizes[2 + 2 * which];
  return p;
}

// The keys as a kernel reads them: CUDA's memory-efficient kernel a key head per query
// head (PyTorch's SDPA repeats grouped keys for it too), the others grouped in place.
at::Tensor heads_for(Kernel kernel, const at::Tensor& kv, int64_t heads) {
  return kernel == Kernel::CudaEfficient && kv.size(1) != heads ? kv.repeat_interleave(heads / kv.size(1), 1) : kv;
}

// A repeated key head's gradients summed back into its group's.
at::Tensor summed_over_repeats(const at::Tensor& grad, int64_t kv_heads) {
  if (grad.size(1) == kv_heads) return grad;
  return grad.reshape({grad.size(0), kv_heads, grad.size(1) / kv_heads, grad.size(2), grad.size(3)}).sum(2);
}

struct ChunkAttentionFunction : torch::autograd::Function<ChunkAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale) {
    ChunkAttentionForward f = chunk_attention_forward(q, k, v, scale);
    std::vector<at::Tensor> keep{q, k, v, f.out};
    keep.insert(keep.end(), f.saved.begin(), f.saved.end());
    ctx->save_for_backward(keep);
    ctx->saved_data["sizes"] = f.sizes;
    ctx->saved_data["scale"] = scale;
    return f.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const std::vector<at::Tensor> state(s.begin() + 4, s.end());
    auto dk = at::zeros_like(s[1]), dv = at::zeros_like(s[2]);
    auto dq = chunk_attention_backward(grads[0], s[0], s[1], s[2], s[3], state, ctx->saved_data["sizes"].toIntVector(),
                                       ctx->saved_data["scale"].toDouble(), dk, dv);
    return {dq, dk, dv, at::Tensor()};
  }
};

void check_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(0) == k.size(0) &&
                  q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 && k.size(2) >= q.size(2),
              "chunk attention of q ", q.sizes(), " over k ", k.sizes(), " and v ", v.sizes(),
              ": the keys must end with the queries' own, their heads divide the queries'");
  TORCH_CHECK(chunk_attention_supported(q), "chunk attention: no fused kernel for ", q.scalar_type(), " on ",
              q.device(), " at head width ", q.size(3));
}

}  // namespace

bool chunk_attention_supported(const at::Tensor& q) { return kernel_for(q) != Kernel::None; }

at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  check_chunk(q, k, v);
  if (k.size(2) == q.size(2))
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale,
                                            /*enable_gqa=*/k.size(1) != q.size(1));
  return ChunkAttentionFunction::apply(q, k, v, scale);
}

// Two calls: the chunk's queries over the keys before it, none masked, and over its own
// keys causally (the kernels' causal: queries and keys start together).
ChunkAttentionForward chunk_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              double scale) {
  check_chunk(q, k, v);
  const Kernel kernel = kernel_for(q);
  const int64_t c = q.size(2), before = k.size(2) - c;
  const auto keys = heads_for(kernel, k, q.size(1)), values = heads_for(kernel, v, q.size(1));
  const Part own = attend(kernel, q, keys.narrow(2, before, c), values.narrow(2, before, c), true, scale);
  Part early;
  ChunkAttentionForward f;
  at::Tensor lse;
  if (before == 0) {
    f.out = own.out;
    lse = own.lse.narrow(-1, 0, c);
  } else {
    early = attend(kernel, q, keys.narrow(2, 0, before), values.narrow(2, 0, before), false, scale);
    // The merged rows: softmax over all the keys is each part's softmax weighted by its
    // share exp(lse_part - lse) of the row's whole sum.
    const auto le = early.lse.narrow(-1, 0, c), lo = own.lse.narrow(-1, 0, c);
    lse = at::logaddexp(le, lo);  // [B, H, c], fp32 (fp64 for fp64 inputs)
    const auto wide = lse.scalar_type();
    f.out = (early.out.to(wide) * (le - lse).exp().unsqueeze(-1) + own.out.to(wide) * (lo - lse).exp().unsqueeze(-1))
                .to(q.scalar_type());
  }
  f.saved.push_back(lse);
  f.sizes.push_back(static_cast<int64_t>(kernel));
  append_part(f, early);
  append_part(f, own);
  return f;
}

// Each call's fused backward with the merged output and log-sum-exp: the query gradients
// of the two calls sum, the key and value gradients are each call's own keys'.
at::Tensor chunk_attention_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const at::Tensor& out, const std::vector<at::Tensor>& saved,
                                    const std::vector<int64_t>& sizes, double scale, const at::Tensor& grad_k,
                                    const at::Tensor& grad_v) {
  check_chunk(q, k, v);
  TORCH_CHECK(grad_k.sizes() == k.sizes() && grad_v.sizes() == v.sizes(), "chunk attention's backward given ",
              grad_k.sizes(), " and ", grad_v.sizes(), " for the gradients of keys and values ", k.sizes());
  const Part early = part_at(saved, sizes, 0), own = part_at(saved, sizes, 1);
  const auto kernel = static_cast<Kernel>(sizes[0]);
  const at::Tensor& lse = saved[0];
  const int64_t c = q.size(2), before = k.size(2) - c, kv_heads = k.size(1);
  const auto keys = heads_for(kernel, k, q.size(1)), values = heads_for(kernel, v, q.size(1));
  const auto g = grad.contiguous(), o = out.contiguous();
  auto [dq, dk, dv] =
      attend_backward(kernel, g, q, keys.narrow(2, before, c), values.narrow(2, before, c), o, lse, own, true, scale);
  grad_k.narrow(2, before, c).add_(summed_over_repeats(dk, kv_heads));
  grad_v.narrow(2, before, c).add_(summed_over_repeats(dv, kv_heads));
  if (before > 0) {
    dk = dv = at::Tensor();  // freed before the other call makes its own
    const auto [dq_early, dk_early, dv_early] = attend_backward(
        kernel, g, q, keys.narrow(2, 0, before), values.narrow(2, 0, before), o, lse, early, false, scale);
    dq.add_(dq_early);
    grad_k.narrow(2, 0, before).add_(summed_over_repeats(dk_early, kv_heads));
    grad_v.narrow(2, 0, before).add_(summed_over_repeats(dv_early, kv_heads));
  }
  return dq;
}

}  // namespace tide
