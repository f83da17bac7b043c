// The attention kernel (at::scaled_dot_product_attention) against the attention written
// out, in fp64, from the module's own weights: causal grouped-query with RoPE (LLaMA) and
// ALiBi (BLOOM), outputs and input gradients, in fp32 and under bf16 compute.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/types.h>

#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/transformer.h"
#include "tiny_models.h"

namespace tide {
namespace {

struct Rope {
  torch::Tensor cos, sin;  // [T, Hd], fp32
};

Rope rope_tables(const ModelConfig& c, int64_t t) {
  const int64_t hd = head_dim(c);
  const auto inv = torch::pow(c.rope_theta, torch::arange(0, hd, 2, torch::kFloat64) / static_cast<double>(hd));
  const auto freqs = torch::outer(torch::arange(t, torch::kFloat64), inv.reciprocal());
  const auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(torch::kFloat32), emb.sin().to(torch::kFloat32)};
}

torch::Tensor rotate(const torch::Tensor& x, const Rope& r) {
  const int64_t half = x.size(-1) / 2;
  const auto rh = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * r.cos.to(x.scalar_type()) + rh * r.sin.to(x.scalar_type());
}

// softmax(q k^T / sqrt(Hd) + bias, causal) v, every step in fp64, key/value heads repeated.
torch::Tensor explicit_attention(AttentionImpl& a, const ModelConfig& c, const torch::Tensor& x_in,
                                 const torch::Tensor& bias, const Rope* rope) {
  const auto x = x_in.to(torch::kFloat64);
  const int64_t b = x.size(0), t = x.size(1), h = c.n_heads, hd = head_dim(c);
  auto lin = [&](const Projection& l) {
    return torch::linear(x, l->weight.to(torch::kFloat64),
                         l->bias.defined() ? l->bias.to(torch::kFloat64) : torch::Tensor());
  };
  torch::Tensor q, k, v;
  if (a.qkv) {
    const auto fused = lin(a.qkv).view({b, t, h, 3, hd});
    q = fused.select(3, 0).transpose(1, 2);
    k = fused.select(3, 1).transpose(1, 2);
    v = fused.select(3, 2).transpose(1, 2);
  } else {
    const int64_t kv = resolved_kv_heads(c);
    q = lin(a.q_proj).view({b, t, h, hd}).transpose(1, 2);
    k = lin(a.k_proj).view({b, t, kv, hd}).transpose(1, 2).repeat_interleave(h / kv, 1);
    v = lin(a.v_proj).view({b, t, kv, hd}).transpose(1, 2).repeat_interleave(h / kv, 1);
  }
  if (rope) {
    q = rotate(q, *rope);
    k = rotate(k, *rope);
  }
  auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(hd));
  if (bias.defined()) scores = scores + bias.to(torch::kFloat64);
  const auto future = torch::ones({t, t}, torch::kBool).triu(1);
  const auto ctx = torch::matmul(scores.masked_fill(future, -INFINITY).softmax(-1), v);
  return torch::linear(ctx.transpose(1, 2).reshape({b, t, h * hd}), a.out->weight.to(torch::kFloat64),
                       a.out->bias.defined() ? a.out->bias.to(torch::kFloat64) : torch::Tensor());
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kFloat64) - want).norm() / want.norm()).item<double>();
}

class AttentionKernel : public ::testing::TestWithParam<ModelConfig> {};

TEST_P(AttentionKernel, MatchesTheExplicitSoftmaxInFp32AndBf16) {
  const ModelConfig c = GetParam();
  torch::manual_seed(11);
  Transformer m(c);
  auto& attn = *std::dynamic_pointer_cast<BlockImpl>((*m->blocks)[0])->attention;
  const int64_t t = 24;
  const auto x = torch::randn({3, t, c.dim}, torch::requires_grad());
  const auto bias = m->attention_bias(t, x.options());
  EXPECT_EQ(bias.defined(), c.positions == PositionKind::ALiBi) << "a mask only for ALiBi";
  const Rope rope = rope_tables(c, t);
  const Rope* r = c.positions == PositionKind::RoPE ? &rope : nullptr;
  const auto cos = r ? r->cos : torch::Tensor(), sin = r ? r->sin : torch::Tensor();

  const auto g = torch::randn({3, t, c.dim}, torch::kFloat64);
  const auto want = explicit_attention(attn, c, x, bias, r);
  const auto want_dx = torch::autograd::grad({want}, {x}, {g})[0].to(torch::kFloat64);

  // fp32: each output is a chain of sums of at most max(D, T) = 32 products of O(1)
  // terms, each rounded at u = 2^-24; 32 u ~ 2e-6 per stage over a handful of stages
  // bounds the error well below 1e-5.
  const auto y = attn.forward(x, bias, cos, sin);
  const auto dx = torch::autograd::grad({y}, {x}, {g.to(torch::kFloat32)})[0];
  EXPECT_LT(relative_error(y, want), 1e-5);
  EXPECT_LT(relative_error(dx, want_dx), 1e-5);

  // bf16 compute: operands rounded at u = 2^-8 (x and weights, q/k/v, probabilities,
  // context, output), each rounding a relative error of at most u, errors that add up
  // over about 8 roundings: 8 u = 0.031.
  const double bf16_bound = 8.0 * std::ldexp(1.0, -8);
  const auto yb = with_compute_dtype(DType::BFloat16, [&] { return attn.forward(x, bias, cos, sin); });
  EXPECT_EQ(yb.scalar_type(), torch::kBFloat16);
  const auto dxb = torch::autograd::grad({yb}, {x}, {g.to(torch::kBFloat16)})[0];
  EXPECT_LT(relative_error(yb, want), bf16_bound);
  EXPECT_LT(relative_error(dxb, want_dx), bf16_bound);
}

INSTANTIATE_TEST_SUITE_P(BothFamilies, AttentionKernel,
                         ::testing::Values(testing::tiny_llama(), testing::tiny_bloom()));

}  // namespace
}  // namespace tide
