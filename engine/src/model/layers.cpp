// Norm, attention, MLP and block of the decoder. See transformer.h for the shape legend.
#include <cmath>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/normalization.h>
#include <torch/torch.h>

#include "tide/engine/model/transformer.h"

namespace tide {
namespace F = torch::nn::functional;

namespace {
// y = x * r * w with r = 1 / sqrt(mean(x^2) + eps) per row, as one autograd node that
// keeps x and r only. Backward: dw = sum_rows(g * x * r);
// dx = r * (g w - x r^2 mean(g w x)).
struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               double eps) {
    const auto r = torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
    ctx->save_for_backward({x, w, r});
    return (x * r).mul_(w);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &r = saved[2];
    const auto& g = grads[0];
    const auto xr = x * r;
    const auto dw = (g * xr).reshape({-1, x.size(-1)}).sum(0);
    const auto gw = g * w;
    const auto dot = (gw * xr).mean(-1, /*keepdim=*/true);
    const auto dx = (gw - xr * dot).mul_(r);
    return {dx, dw, torch::Tensor()};
  }
};
}  // namespace

NormImpl::NormImpl(NormKind kind, int64_t dim, double eps) : kind_(kind), dim_(dim), eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
  if (kind == NormKind::LayerNorm) bias = register_parameter("bias", torch::zeros({dim}));
}

void NormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.fill_(1.0);
  if (bias.defined()) bias.zero_();
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  if (kind_ == NormKind::LayerNorm) return torch::layer_norm(x, {dim_}, weight, bias, eps_);
  // RMSNorm: x / sqrt(mean(x^2) + eps) * w, statistics in fp32 (or fp64 for fp64 x).
  const auto xf = x.scalar_type() == torch::kFloat64 ? x : x.to(torch::kFloat32);
  return RmsNormFn::apply(xf, weight.to(xf.scalar_type()), eps_).to(x.scalar_type());
}

namespace {
torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// HF rotary convention: the head dimension is split in halves, (x1, x2) → (-x2, x1).
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;  // x [B, *, T, Hd], cos/sin [T, Hd]
}
}  // namespace

AttentionImpl::AttentionImpl(const ModelConfig& cfg) : cfg_(cfg) {
  const int64_t d = cfg.dim, kv = resolved_kv_heads(cfg) * head_dim(cfg);
  if (cfg.family == Family::BLOOM) {
    qkv = register_module("query_key_value", linear(d, 3 * d, cfg.attention_bias));
    out = register_module("dense", linear(d, d, cfg.attention_bias));
  } else {
    q_proj = register_module("q_proj", linear(d, d, cfg.attention_bias));
    k_proj = register_module("k_proj", linear(d, kv, cfg.attention_bias));
    v_proj = register_module("v_proj", linear(d, kv, cfg.attention_bias));
    out = register_module("o_proj", linear(d, d, cfg.attention_bias));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& bias, const torch::Tensor& cos,
                                     const torch::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1), h = cfg_.n_heads, hd = head_dim(cfg_);
  const int64_t k_heads = resolved_kv_heads(cfg_);
  torch::Tensor q, k, v;
  if (qkv) {
    // BLOOM's fused layout: output features are ordered [H, 3, Hd].
    const auto fused = qkv(x).view({b, t, h, 3, hd});
    q = fused.select(3, 0).transpose(1, 2);  // [B, H, T, Hd]
    k = fused.select(3, 1).transpose(1, 2);
    v = fused.select(3, 2).transpose(1, 2);
  } else {
    q = q_proj(x).view({b, t, h, hd}).transpose(1, 2);          // [B, H, T, Hd]
    k = k_proj(x).view({b, t, k_heads, hd}).transpose(1, 2);    // [B, K, T, Hd]
    v = v_proj(x).view({b, t, k_heads, hd}).transpose(1, 2);
  }
  if (cos.defined()) {
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);
  }
  if (k_heads != h) {  // grouped-query: each key/value head serves H / K query heads
    const int64_t rep = h / k_heads;
    k = k.unsqueeze(2).expand({b, k_heads, rep, t, hd}).reshape({b, h, t, hd});
    v = v.unsqueeze(2).expand({b, k_heads, rep, t, hd}).reshape({b, h, t, hd});
  }
  const auto q3 = q.reshape({b * h, t, hd});
  const auto kt3 = k.reshape({b * h, t, hd}).transpose(1, 2);  // [B*H, Hd, T]
  // scores = bias + (q k^T) / sqrt(Hd), the scale and the add fused into the GEMM.
  torch::Tensor input = bias;
  if (bias.dim() == 3) input = bias.unsqueeze(0).expand({b, h, t, t}).reshape({b * h, t, t});
  auto probs = torch::softmax(torch::baddbmm(input, q3, kt3, 1.0, 1.0 / std::sqrt(static_cast<double>(hd))), -1);
  if (cfg_.dropout > 0 && is_training()) probs = F::dropout(probs, F::DropoutFuncOptions().p(cfg_.dropout));
  const auto ctx = torch::bmm(probs, v.reshape({b * h, t, hd}));              // [B*H, T, Hd]
  return out(ctx.view({b, h, t, hd}).transpose(1, 2).reshape({b, t, h * hd}));  // [B, T, D]
}

MlpImpl::MlpImpl(const ModelConfig& cfg) : kind_(cfg.mlp) {
  const int64_t d = cfg.dim, f = resolved_ffn_dim(cfg);
  const bool bloom_names = cfg.family == Family::BLOOM && cfg.mlp == MlpKind::GELU;
  if (kind_ == MlpKind::SwiGLU) gate = register_module("gate_proj", linear(d, f, cfg.mlp_bias));
  up = register_module(bloom_names ? "dense_h_to_4h" : "up_proj", linear(d, f, cfg.mlp_bias));
  down = register_module(bloom_names ? "dense_4h_to_h" : "down_proj", linear(f, d, cfg.mlp_bias));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  if (kind_ == MlpKind::SwiGLU) return down(torch::silu(gate(x)) * up(x));
  return down(torch::gelu(up(x), "tanh"));
}

BlockImpl::BlockImpl(const ModelConfig& cfg) : dropout_(cfg.dropout) {
  input_norm = register_module("input_layernorm", Norm(cfg.norm, cfg.dim, cfg.norm_eps));
  attention = register_module(cfg.family == Family::BLOOM ? "self_attention" : "self_attn", Attention(cfg));
  post_attention_norm = register_module("post_attention_layernorm", Norm(cfg.norm, cfg.dim, cfg.norm_eps));
  mlp = register_module("mlp", Mlp(cfg));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& bias, const torch::Tensor& cos,
                                 const torch::Tensor& sin) {
  auto a = attention(input_norm(x), bias, cos, sin);
  if (dropout_ > 0 && is_training()) a = F::dropout(a, F::DropoutFuncOptions().p(dropout_));
  auto h = x + a;
  auto m = mlp(post_attention_norm(h));
  if (dropout_ > 0 && is_training()) m = F::dropout(m, F::DropoutFuncOptions().p(dropout_));
  return h + m;
}

}  // namespace tide
