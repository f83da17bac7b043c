// The attention kernel (at::scaled_dot_product_attention) against the attention written
// out, in fp64, from the module's own weights: causal grouped-query with RoPE (LLaMA) and
// ALiBi (BLOOM), outputs and input gradients, in fp32 and under bf16 compute; and the
// soft-capped attention of Gemma 2 (softcapped_attention.h) the same way; attention over a
// window in parts (attention_masks.h) against the whole mask.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/types.h>

#include "cuda_skip.h"
#include "tide/engine/config.h"
#include "tide/engine/model/attention_masks.h"
#include "tide/engine/model/chunk_attention.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/context_parallel.h"
#include "tide/engine/model/softcapped_attention.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/train/tensor_memory.h"
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

// softmax(q k^T / sqrt(Hd) + bias, causal) v, every step in fp64, key/value heads repeated;
// with model.attention_softcap the scores capped first, cap * tanh(score / cap).
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
  if (const double cap = c.attention_softcap; cap > 0) scores = (scores / cap).tanh() * cap;
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
  ModelConfig c = GetParam();
  // Soft-capped (Gemma 2), scores large enough for the cap to bend them: weights of std
  // 0.3 make q and k of about 0.3 sqrt(D) = 1.7 a component, scores of a few units.
  const bool capped = c.attention_softcap > 0;
  if (capped) c.init_std = 0.3;
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
  if (capped) {  // the cap is in play: attention without it is far off
    ModelConfig uncapped = c;
    uncapped.attention_softcap = 0;
    EXPECT_GT(relative_error(y, explicit_attention(attn, uncapped, x, bias, r)), 0.05);
  }

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

// The soft-capped op itself, a block of queries at a time, against the formula written
// out in fp64 (key/value heads repeated, autograd for the gradients): causal, a boolean
// mask (two documents and a window of 4), an additive bias (ALiBi-like, -inf above the
// diagonal); one block, blocks that divide nothing evenly, one query a block. The same
// fp64 sums in another order: within 1e-12.
struct AttentionReference {
  torch::Tensor out, dq, dk, dv;
};

AttentionReference written_out(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& bias, double scale, double cap, const torch::Tensor& g) {
  auto q2 = q.clone().requires_grad_(), k2 = k.clone().requires_grad_(), v2 = v.clone().requires_grad_();
  const int64_t groups = q.size(1) / k.size(1), t = q.size(2);
  auto s = torch::matmul(q2, k2.repeat_interleave(groups, 1).transpose(-1, -2)) * scale;
  if (cap > 0) s = (s / cap).tanh() * cap;  // 0: no cap
  if (!bias.defined())
    s = s.masked_fill(torch::ones({t, t}, torch::kBool).triu(1), -INFINITY);
  else if (bias.scalar_type() == torch::kBool)
    s = s.masked_fill(bias.logical_not(), -INFINITY);
  else
    s = s + bias;
  const auto out = torch::matmul(s.softmax(-1), v2.repeat_interleave(groups, 1));
  const auto grads = torch::autograd::grad({out}, {q2, k2, v2}, {g});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

TEST(SoftcappedAttention, BlocksOfQueriesGiveTheWrittenOutFormulaAndItsGradients) {
  torch::manual_seed(21);
  const int64_t b = 2, h = 4, kv = 2, t = 13, hd = 8;
  const auto q = torch::randn({b, h, t, hd}, torch::kFloat64), k = torch::randn({b, kv, t, hd}, torch::kFloat64);
  const auto v = torch::randn({b, kv, t, hd}, torch::kFloat64), g = torch::randn({b, h, t, hd}, torch::kFloat64);
  const double scale = 1 / std::sqrt(8.0), cap = 2.0;  // scores of a few units: the cap bends them
  auto documents = torch::zeros({b, t}, torch::kInt64);
  documents.narrow(1, 6, t - 6).fill_(1);
  const auto band = torch::ones({t, t}, torch::kBool).tril().triu(-3);  // a window of 4
  const auto boolean = documents.unsqueeze(2).eq(documents.unsqueeze(1)).logical_and(band).unsqueeze(1);
  const auto distance = torch::arange(t, torch::kFloat64).unsqueeze(0) - torch::arange(t, torch::kFloat64).unsqueeze(1);
  const auto additive = (torch::tensor({0.5, 0.25, 0.125, 0.0625}, torch::kFloat64).view({1, h, 1, 1}) * distance)
                            .masked_fill(distance.gt(0), -INFINITY);
  for (const auto& bias : {torch::Tensor(), boolean, additive}) {
    const AttentionReference want = written_out(q, k, v, bias, scale, cap, g);
    for (const int64_t block : {int64_t{0}, int64_t{5}, int64_t{1}}) {
      SCOPED_TRACE(::testing::Message() << (bias.defined() ? bias.scalar_type() == torch::kBool ? "boolean" : "additive"
                                                           : "causal")
                                        << ", blocks of " << block);
      auto q1 = q.clone().requires_grad_(), k1 = k.clone().requires_grad_(), v1 = v.clone().requires_grad_();
      const auto out = softcapped_attention(q1, k1, v1, bias, scale, cap, 0.0, block);
      const auto grads = torch::autograd::grad({out}, {q1, k1, v1}, {g});
      EXPECT_LT(relative_error(out, want.out), 1e-12);
      EXPECT_LT(relative_error(grads[0], want.dq), 1e-12);
      EXPECT_LT(relative_error(grads[1], want.dk), 1e-12);
      EXPECT_LT(relative_error(grads[2], want.dv), 1e-12);
    }
    // Under dropout the scores are written out whole: with p = 1e-12 none is dropped, and
    // the kept ones are scaled by 1 / (1 - p).
    auto q1 = q.clone().requires_grad_();
    const auto dropped = softcapped_attention(q1, k, v, bias, scale, cap, 1e-12);
    EXPECT_LT(relative_error(dropped, want.out), 1e-10);
    EXPECT_LT(relative_error(torch::autograd::grad({dropped}, {q1}, {g})[0], want.dq), 1e-10);
  }
}

// Forward keeps the output and a log-sum-exp a row; a block's scores are all that is
// made at once, never the T x T scores of every head (1 MiB here, in blocks of 16 rows).
TEST(SoftcappedAttention, NeverHoldsTheScoresOfEveryQuery) {
  count_host_tensor_memory();
  torch::manual_seed(22);
  const int64_t b = 1, h = 4, kv = 2, t = 256, hd = 16;
  auto q = torch::randn({b, h, t, hd}).requires_grad_(), k = torch::randn({b, kv, t, hd}).requires_grad_();
  auto v = torch::randn({b, kv, t, hd}).requires_grad_();
  const int64_t scores_bytes = b * h * t * t * 4;
  const int64_t before = host_tensor_bytes();
  reset_peak_host_tensor_bytes();
  const auto out = softcapped_attention(q, k, v, {}, 0.25, 2.0, 0.0, 16);
  out.sum().backward();
  const int64_t peak = peak_host_tensor_bytes() - before;
  EXPECT_LT(peak, scores_bytes / 2);
}

// The whole [B or 1, H or 1, T, T] additive mask of a window, documents apart and ALiBi,
// in fp64, written out from the positions.
torch::Tensor dense_bias(int64_t t, int64_t window, const torch::Tensor& documents, const torch::Tensor& slopes) {
  const auto i = torch::arange(t, torch::kInt64).unsqueeze(1), j = torch::arange(t, torch::kInt64).unsqueeze(0);
  auto allowed = j.le(i).logical_and(i.sub(j).lt(window)).view({1, 1, t, t});
  if (documents.defined())
    allowed = allowed.logical_and(documents.unsqueeze(2).eq(documents.unsqueeze(1)).unsqueeze(1));
  auto bias = torch::zeros({1, 1, t, t}, torch::kFloat64);
  if (slopes.defined()) bias = slopes.to(torch::kFloat64).view({1, -1, 1, 1}) * (j - i).to(torch::kFloat64);
  return bias.masked_fill(allowed.logical_not(), -INFINITY);
}

// A window shorter than the sequence attended in parts (attention_masks.h) against the
// same attention written out with the whole [T, T] mask: outputs and the gradients of q, k
// and v, through LibTorch's attention and the soft-capped op, with and without documents
// apart and ALiBi's bias. The same fp64 sums in another order (and the zeros of -inf
// added where the whole mask adds them): within 1e-12.
TEST(WindowedAttention, PartsGiveTheWholeMasksOutputAndGradients) {
  torch::manual_seed(31);
  const int64_t b = 2, h = 4, kv = 2, hd = 8;
  const double scale = 1 / std::sqrt(8.0);
  struct Case {
    int64_t t, window, rows;
  };
  // Whole blocks only; a tail of 1 and of 2; blocks of 1; a block as wide as the window;
  // no whole block (the first w queries, then the tail).
  const Case cases[] = {{13, 5, 4}, {13, 4, 4}, {13, 4, 3}, {12, 3, 1}, {20, 6, 6}, {9, 6, 4}};
  for (const Case& c : cases) {
    const auto q = torch::randn({b, h, c.t, hd}, torch::kFloat64), k = torch::randn({b, kv, c.t, hd}, torch::kFloat64);
    const auto v = torch::randn({b, kv, c.t, hd}, torch::kFloat64), g = torch::randn({b, h, c.t, hd}, torch::kFloat64);
    auto documents = torch::zeros({b, c.t}, torch::kInt64);
    documents[0].narrow(0, 7, c.t - 7).fill_(1);  // two documents in the first row, one in the second
    const auto slopes = torch::tensor({0.5, 0.25, 0.125, 0.0625}, torch::kFloat32);
    for (const bool docs : {false, true})
      for (const bool alibi : {false, true})
        for (const double cap : {0.0, 2.0}) {
          SCOPED_TRACE(::testing::Message()
                       << "t " << c.t << ", window " << c.window << ", blocks of " << c.rows
                       << (docs ? ", documents" : "") << (alibi ? ", ALiBi" : "") << (cap > 0 ? ", soft-capped" : ""));
          const auto d = docs ? documents : torch::Tensor();
          const auto s = alibi ? slopes : torch::Tensor();
          const auto parts = windowed_attention_parts(c.t, c.window, c.rows, d, s, q.options());
          const PartAttention attend = [&](const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp,
                                           const at::Tensor& mask) {
            if (cap > 0) return softcapped_attention(qp, kp, vp, mask, scale, cap, 0.0);
            return at::scaled_dot_product_attention(qp, kp, vp,
                                                    mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt,
                                                    0.0, !mask.defined(), scale, /*enable_gqa=*/true);
          };
          auto q1 = q.clone().requires_grad_(), k1 = k.clone().requires_grad_(), v1 = v.clone().requires_grad_();
          const auto out = windowed_attention(q1, k1, v1, parts, attend);
          const auto grads = torch::autograd::grad({out}, {q1, k1, v1}, {g});
          const AttentionReference want = written_out(q, k, v, dense_bias(c.t, c.window, d, s), scale, cap, g);
          EXPECT_LT(relative_error(out, want.out), 1e-12);
          EXPECT_LT(relative_error(grads[0], want.dq), 1e-12);
          EXPECT_LT(relative_error(grads[1], want.dk), 1e-12);
          EXPECT_LT(relative_error(grads[2], want.dv), 1e-12);
        }
  }
}

// The parts' masks hold R + w keys a query, never the sequence's: at 2048 tokens and a
// window of 64 forward and backward together stay under half of one [T, T] fp32 mask
// (16 MiB), where a dense mask alone is that whole.
TEST(WindowedAttention, NoPartHoldsAMaskOrScoresOfTheWholeSequence) {
  count_host_tensor_memory();
  torch::manual_seed(32);
  const int64_t b = 1, h = 2, kv = 1, t = 2048, hd = 16, window = 64;
  auto q = torch::randn({b, h, t, hd}).requires_grad_(), k = torch::randn({b, kv, t, hd}).requires_grad_();
  auto v = torch::randn({b, kv, t, hd}).requires_grad_();
  const int64_t dense_mask_bytes = t * t * 4;
  const int64_t before = host_tensor_bytes();
  reset_peak_host_tensor_bytes();
  const auto parts = windowed_attention_parts(t, window, window_block_rows(window), {}, {}, q.options());
  const PartAttention attend = [](const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp,
                                  const at::Tensor& mask) {
    return at::scaled_dot_product_attention(qp, kp, vp, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt,
                                            0.0, !mask.defined(), std::nullopt, /*enable_gqa=*/true);
  };
  windowed_attention(q, k, v, parts, attend).sum().backward();
  const int64_t peak = peak_host_tensor_bytes() - before;
  EXPECT_LT(peak, dense_mask_bytes / 2);
  EXPECT_TRUE(q.grad().isfinite().all().item<bool>());
}

TEST(WindowedAttention, RefusesAWindowThatLeavesOutNothing) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  EXPECT_THROW(windowed_attention_parts(8, 8, 4, {}, {}, opts), c10::Error);
  EXPECT_THROW(windowed_attention_parts(8, 4, 0, {}, {}, opts), c10::Error);
}

// Gemma 2's soft-capped scores (a cap of 2) take the blocked path of their own.
ModelConfig capped(ModelConfig c) {
  c.attention_softcap = 2.0;
  return c;
}

INSTANTIATE_TEST_SUITE_P(BothFamilies, AttentionKernel,
                         ::testing::Values(testing::tiny_llama(), testing::tiny_bloom(), capped(testing::tiny_llama()),
                                           capped(testing::tiny_bloom())),
                         [](const auto& info) {
                           return std::string(info.param.family == Family::LLaMA ? "llama" : "bloom") +
                                  (info.param.attention_softcap > 0 ? "_softcapped" : "");
                         });

// A context-parallel chunk (chunk_attention.h): c queries after P other keys, each seeing
// every key up to its own, as two fused calls merged by log-sum-exp, against the formula
// written out with the mask [c, P + c]; grouped and ungrouped keys, no key before the
// chunk (one causal call), a single query. fp64: the same sums in another order, within
// 1e-12. fp32: sums of at most P + c = 30 products of O(1) terms, rounded at u = 2^-24,
// then the merge's few roundings: 30 u ~ 2e-6 a stage over a handful of stages, under
// 1e-5. bf16: q, k, v, the probabilities, the parts' outputs and the merged output each
// rounded at 2^-8 (fp32 sums and log-sum-exp between): 8 roundings, 8 x 2^-8.
void expect_chunk_attention_matches(const torch::Device& device) {
  torch::manual_seed(23);
  const int64_t b = 2, h = 4, hd = 8;
  const double scale = 1 / std::sqrt(8.0);
  for (const int64_t kv : {int64_t{2}, int64_t{4}})
    for (const auto& [c, before] : std::vector<std::pair<int64_t, int64_t>>{{6, 24}, {6, 0}, {1, 9}}) {
      const auto q = torch::randn({b, h, c, hd}, torch::kFloat64), g = torch::randn({b, h, c, hd}, torch::kFloat64);
      const auto k = torch::randn({b, kv, before + c, hd}, torch::kFloat64);
      const auto v = torch::randn({b, kv, before + c, hd}, torch::kFloat64);
      const auto allowed = torch::ones({c, before + c}, torch::kBool).tril(before);
      const AttentionReference want = written_out(q, k, v, allowed, scale, 0, g);
      const std::vector<std::pair<torch::ScalarType, double>> bounds =
          device.is_cpu() ? std::vector<std::pair<torch::ScalarType, double>>{{torch::kFloat64, 1e-12},
                                                                              {torch::kFloat32, 1e-5},
                                                                              {torch::kBFloat16, 8.0 / 256}}
                          : std::vector<std::pair<torch::ScalarType, double>>{{torch::kFloat32, 1e-5},
                                                                              {torch::kBFloat16, 8.0 / 256}};
      for (const auto& dtype_bound : bounds) {
        const torch::ScalarType dtype = dtype_bound.first;  // captured below: not a structured binding
        const double bound = dtype_bound.second;
        SCOPED_TRACE(::testing::Message() << kv << " key heads, " << c << " queries after " << before << " keys, "
                                          << c10::toString(dtype) << " on " << device);
        const auto on = [&](const torch::Tensor& t) { return t.to(device, dtype).requires_grad_(); };
        auto q1 = on(q), k1 = on(k), v1 = on(v);
        ASSERT_TRUE(chunk_attention_supported(q1));
        const auto out = chunk_attention(q1, k1, v1, scale);
        ASSERT_EQ(out.scalar_type(), dtype);
        const auto grads = torch::autograd::grad({out}, {q1, k1, v1}, {g.to(device, dtype)});
        EXPECT_LT(relative_error(out.cpu(), want.out), bound);
        EXPECT_LT(relative_error(grads[0].cpu(), want.dq), bound);
        EXPECT_LT(relative_error(grads[1].cpu(), want.dk), bound);
        EXPECT_LT(relative_error(grads[2].cpu(), want.dv), bound);
        // The same without autograd (context parallelism's node), also where no key comes
        // before the chunk (one causal call, which chunk_attention leaves to SDPA).
        const ChunkAttentionForward f = chunk_attention_forward(q1.detach(), k1.detach(), v1.detach(), scale);
        const auto dk = torch::zeros_like(k1), dv = torch::zeros_like(v1);
        const auto dq = chunk_attention_backward(g.to(device, dtype), q1.detach(), k1.detach(), v1.detach(), f.out,
                                                 f.saved, f.sizes, scale, dk, dv);
        EXPECT_LT(relative_error(f.out.cpu(), want.out), bound);
        EXPECT_LT(relative_error(dq.cpu(), want.dq), bound);
        EXPECT_LT(relative_error(dk.cpu(), want.dk), bound);
        EXPECT_LT(relative_error(dv.cpu(), want.dv), bound);
      }
    }
}

TEST(ChunkAttention, TwoFusedCallsGiveTheMaskedFormulaAndItsGradients) { expect_chunk_attention_matches(torch::kCPU); }

TEST(ChunkAttention, CudaKernelsGiveTheMaskedFormulaAndItsGradients) {
  SKIP_WITHOUT_CUDA();
  expect_chunk_attention_matches(torch::Device(torch::kCUDA, 0));
}

// Refused by name: keys that do not end with the queries' own, heads that do not divide.
TEST(ChunkAttention, RefusesKeysThatCannotHoldTheChunk) {
  const auto q = torch::randn({1, 4, 6, 8});
  EXPECT_THROW(chunk_attention(q, torch::randn({1, 2, 5, 8}), torch::randn({1, 2, 5, 8}), 1.0), c10::Error);
  EXPECT_THROW(chunk_attention(q, torch::randn({1, 3, 9, 8}), torch::randn({1, 3, 9, 8}), 1.0), c10::Error);
  EXPECT_FALSE(chunk_attention_supported(torch::zeros({1, 4, 6, 8}, torch::kInt64)));
}

TEST(ContextParallel, EachRankHoldsAnEarlyAndALateChunk) {
  // 16 tokens over cp = 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2,
  // so each rank's queries see 4 + 16 and 8 + 12 keys: the same causal work.
  const auto r0 = context_positions(16, 0, 2, torch::kCPU), r1 = context_positions(16, 1, 2, torch::kCPU);
  EXPECT_TRUE(r0.equal(torch::tensor({0, 1, 2, 3, 12, 13, 14, 15}, torch::kLong)));
  EXPECT_TRUE(r1.equal(torch::tensor({4, 5, 6, 7, 8, 9, 10, 11}, torch::kLong)));
  // cp = 3 on 24 tokens: every position held exactly once.
  std::vector<torch::Tensor> all;
  for (int r = 0; r < 3; ++r) all.push_back(context_positions(24, r, 3, torch::kCPU));
  EXPECT_TRUE(std::get<0>(torch::cat(all).sort()).equal(torch::arange(24, torch::kLong)));
  EXPECT_THROW(context_positions(20, 0, 3, torch::kCPU), c10::Error);  // 20 tokens are not 6 equal chunks
  // Without a group the slice is the tensor itself.
  const auto x = torch::arange(32).view({2, 16});
  EXPECT_TRUE(context_slice(x, 1, ContextParallel{}).equal(x));
}

}  // namespace
}  // namespace tide
