// The fused ops' hand-written backward passes against autograd through the ops they
// replace, in fp64 (on the CPU: LibTorch's formulas; on CUDA the kernels are checked
// against these in cuda_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/fused_ops.h"
#include "tide/engine/train/tensor_memory.h"

namespace tide {
namespace {

struct Grads {
  torch::Tensor out;
  std::vector<torch::Tensor> inputs;
};

// out and the inputs' gradients under a random upstream gradient.
template <typename F>
Grads run(F f, std::vector<torch::Tensor> inputs, const torch::Tensor& upstream) {
  for (auto& t : inputs) t = t.detach().clone().requires_grad_();
  const auto out = f(inputs);
  out.backward(upstream);
  Grads g{out.detach(), {}};
  for (auto& t : inputs) g.inputs.push_back(t.grad());
  return g;
}

void expect_same(const Grads& a, const Grads& b) {
  EXPECT_TRUE(torch::allclose(a.out, b.out, 1e-12, 1e-12));
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  for (size_t i = 0; i < a.inputs.size(); ++i)
    EXPECT_TRUE(torch::allclose(a.inputs[i], b.inputs[i], 1e-10, 1e-12)) << "input " << i;
}

TEST(FusedOps, RmsNormBackwardIsAutogradsThroughTheFormula) {
  torch::manual_seed(1);
  const auto x = torch::randn({3, 5, 16}, torch::kFloat64), w = torch::randn({16}, torch::kFloat64);
  const auto up = torch::randn({3, 5, 16}, torch::kFloat64);
  const double eps = 1e-5;
  const auto fused = run([&](auto& in) { return rms_norm(in[0], in[1], eps); }, {x, w}, up);
  const auto reference =
      run([&](auto& in) { return in[0] * torch::rsqrt(in[0].pow(2).mean(-1, true) + eps) * in[1]; }, {x, w}, up);
  expect_same(fused, reference);
}

TEST(FusedOps, RmsNormKeepsItsStatisticsInFp32ForBf16Input) {
  torch::manual_seed(2);
  const auto x = torch::randn({4, 32}) * 3, w = torch::randn({32});
  const auto y = rms_norm(x.to(torch::kBFloat16), w, 1e-6);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  const auto xb = x.to(torch::kBFloat16).to(torch::kFloat64);
  const auto exact = xb * torch::rsqrt(xb.pow(2).mean(-1, true) + 1e-6) * w.to(torch::kFloat64);
  // One rounding to bf16 (2^-8 relative) of a value computed in fp32.
  EXPECT_TRUE((y.to(torch::kFloat64) - exact).abs().le(exact.abs() / 256 + 1e-30).all().item<bool>());
}

TEST(FusedOps, SwigluBackwardIsAutogradsThroughSiluTimesUp) {
  torch::manual_seed(3);
  const auto g = torch::randn({6, 40}, torch::kFloat64) * 3, u = torch::randn({6, 40}, torch::kFloat64);
  const auto up = torch::randn({6, 40}, torch::kFloat64);
  const auto fused = run([](auto& in) { return swiglu(in[0], in[1]); }, {g, u}, up);
  const auto reference = run([](auto& in) { return torch::silu(in[0]) * in[1]; }, {g, u}, up);
  expect_same(fused, reference);
}

TEST(FusedOps, SwigluDownIsTheProductThenItsProjection) {
  torch::manual_seed(4);
  // In fp64 against autograd through the formula; in fp32 and bf16 the bits of the ops it
  // replaces (the same products in the same order).
  const auto g = torch::randn({2, 6, 40}, torch::kFloat64) * 3, u = torch::randn({2, 6, 40}, torch::kFloat64);
  const auto w = torch::randn({24, 40}, torch::kFloat64), up = torch::randn({2, 6, 24}, torch::kFloat64);
  expect_same(run([](auto& in) { return swiglu_down(in[0], in[1], in[2]); }, {g, u, w}, up),
              run([](auto& in) { return torch::matmul(torch::silu(in[0]) * in[1], in[2].t()); }, {g, u, w}, up));
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto fused = run([](auto& in) { return swiglu_down(in[0], in[1], in[2]); },
                           {g.to(dtype), u.to(dtype), w.to(dtype)}, up.to(dtype));
    const auto unfused = run([](auto& in) { return torch::linear(swiglu(in[0], in[1]), in[2]); },
                             {g.to(dtype), u.to(dtype), w.to(dtype)}, up.to(dtype));
    EXPECT_TRUE(torch::equal(fused.out, unfused.out)) << dtype;
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(fused.inputs[i], unfused.inputs[i])) << dtype << " " << i;
  }
  EXPECT_THROW(swiglu_down(g, u, w.t()), c10::Error);
}

TEST(FusedOps, SwigluDownKeepsNotTheProduct) {
  count_host_tensor_memory();
  torch::manual_seed(5);
  const int64_t n = 256, f = 512, d = 64;
  const auto g = torch::randn({n, f}).requires_grad_(), u = torch::randn({n, f}).requires_grad_();
  const auto w = torch::randn({d, f}).requires_grad_();
  // What a forward leaves alive beyond its output: what its graph keeps for backward.
  const auto kept = [&](auto fn) {
    const int64_t before = host_tensor_bytes();
    const auto y = fn();
    return host_tensor_bytes() - before - y.numel() * 4;
  };
  EXPECT_EQ(kept([&] { return swiglu_down(g, u, w); }), 0);                    // gate, up and the weight exist already
  EXPECT_EQ(kept([&] { return torch::linear(swiglu(g, u), w); }), n * f * 4);  // the product
}

TEST(FusedOps, AProjectionIsAutocastsLinearWithTheWeightCastAgainInBackward) {
  torch::manual_seed(6);
  // Under bf16 compute with no WeightCastScope: the bits of autocast's at::linear, whose
  // saved bf16 weight the node makes again in backward; with and without a bias, from a
  // bf16 and an fp32 input.
  for (const bool with_bias : {false, true}) {
    for (const auto x_dtype : {torch::kBFloat16, torch::kFloat32}) {
      const auto x = torch::randn({2, 5, 24}).to(x_dtype), w = torch::randn({16, 24});
      const auto b = with_bias ? torch::randn({16}) : torch::Tensor();
      const auto up = torch::randn({2, 5, 16}, torch::kBFloat16);
      const auto under_autocast = [&](auto f) {
        return run([&](auto& in) { return with_compute_dtype(DType::BFloat16, [&] { return f(in); }); },
                   with_bias ? std::vector<torch::Tensor>{x, w, b} : std::vector<torch::Tensor>{x, w}, up);
      };
      const auto bias_of = [&](auto& in) { return with_bias ? in[2] : torch::Tensor(); };
      const auto node = under_autocast([&](auto& in) { return projection(in[0], in[1], bias_of(in)); });
      const auto plain = under_autocast([&](auto& in) { return torch::linear(in[0], in[1], bias_of(in)); });
      EXPECT_EQ(node.out.scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(torch::equal(node.out, plain.out)) << with_bias << " " << x_dtype;
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        EXPECT_EQ(node.inputs[i].scalar_type(), plain.inputs[i].scalar_type()) << i;
        EXPECT_TRUE(torch::equal(node.inputs[i], plain.inputs[i])) << with_bias << " " << x_dtype << " input " << i;
      }
    }
  }
}

TEST(FusedOps, AProjectionKeepsNoCopyOfItsWeightUnlessAScopeKeepsThem) {
  count_host_tensor_memory();
  torch::manual_seed(7);
  const int64_t n = 64, in = 256, out = 512;
  const auto x = torch::randn({n, in}, torch::kBFloat16).requires_grad_();
  const auto w = torch::randn({out, in}).requires_grad_();
  // What a bf16 forward leaves alive beyond its output: what its graph keeps for backward.
  const auto kept = [&](auto fn) {
    const int64_t before = host_tensor_bytes();
    const auto y = with_compute_dtype(DType::BFloat16, fn);
    return host_tensor_bytes() - before - y.numel() * 2;
  };
  EXPECT_EQ(kept([&] { return projection(x, w, {}); }), 0);                // x and the fp32 weight exist already
  EXPECT_EQ(kept([&] { return torch::linear(x, w, {}); }), out * in * 2);  // autocast's bf16 copy
  // Under a WeightCastScope the copy serves every micro-batch: the projection keeps it too.
  const WeightCastScope step(true);
  EXPECT_EQ(kept([&] { return projection(x, w, {}); }), out * in * 2);
}

TEST(FusedOps, RotaryBackwardRotatesTheGradientBack) {
  torch::manual_seed(4);
  const int64_t b = 2, h = 3, t = 5, hd = 8;
  // q as the attention makes it: a [B, H, T, Hd] view of [B, T, H, Hd] memory.
  const auto x = torch::randn({b, t, h, hd}, torch::kFloat64).transpose(1, 2);
  const auto angle = torch::randn({t, hd / 2}, torch::kFloat64);
  const auto emb = torch::cat({angle, angle}, -1);
  const auto cos = emb.cos(), sin = emb.sin();
  const auto up = torch::randn({b, h, t, hd}, torch::kFloat64);
  const auto fused = run([&](auto& in) { return rotary(in[0], cos, sin); }, {x}, up);
  const auto reference = run(
      [&](auto& in) {
        const auto& v = in[0];
        const auto rotated = torch::cat({-v.narrow(-1, hd / 2, hd / 2), v.narrow(-1, 0, hd / 2)}, -1);
        return v * cos + rotated * sin;
      },
      {x}, up);
  expect_same(fused, reference);
  // A rotation keeps each pair's length.
  const auto pair_norm = [&](const torch::Tensor& v) {
    return v.narrow(-1, 0, hd / 2).pow(2) + v.narrow(-1, hd / 2, hd / 2).pow(2);
  };
  EXPECT_TRUE(torch::allclose(pair_norm(fused.out), pair_norm(x), 1e-12, 1e-12));
}

TEST(FusedOps, TheCpuTakesLibTorchsOps) {
  EXPECT_FALSE(fused_kernels_take(torch::ones({2})));
  auto logits = torch::zeros({2, 3});
  EXPECT_THROW(cross_entropy_rows_(logits, torch::zeros({2}, torch::kLong), false), c10::Error);
}

}  // namespace
}  // namespace tide
