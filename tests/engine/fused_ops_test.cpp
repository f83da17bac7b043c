// The fused ops' hand-written backward passes against autograd through the ops they
// replace, in fp64 (on the CPU: LibTorch's formulas; on CUDA the kernels are checked
// against these in cuda_test.cpp).
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/types.h>

#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/fused_ops.h"
#include "tide/engine/train/tensor_memory.h"

#include "normed_projections_reference.h"

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

TEST(FusedOps, LayerNormIsLibTorchsInFp32) {
  torch::manual_seed(11);
  const auto x = torch::randn({3, 5, 16}) * 2, w = torch::randn({16}), b = torch::randn({16});
  const auto up = torch::randn({3, 5, 16});
  const auto tide = run([](auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); }, {x, w, b}, up);
  const auto libtorch = run([](auto& in) { return torch::layer_norm(in[0], {16}, in[1], in[2], 1e-5); }, {x, w, b}, up);
  EXPECT_TRUE(torch::equal(tide.out, libtorch.out));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(tide.inputs[i], libtorch.inputs[i])) << i;
  // A bf16 input is normalised in fp32 and the result rounded once.
  const auto xb = x.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(layer_norm(xb, w, b, 1e-5),
                           torch::layer_norm(xb.to(torch::kFloat32), {16}, w, b, 1e-5).to(torch::kBFloat16)));
}

// Each gated activation beside the formula it computes.
const std::vector<std::pair<GateActivation, std::function<torch::Tensor(const torch::Tensor&)>>> kGates{
    {GateActivation::Silu, [](const torch::Tensor& g) { return torch::silu(g); }},
    {GateActivation::GeluTanh, [](const torch::Tensor& g) { return torch::gelu(g, "tanh"); }},
};

TEST(FusedOps, GluBackwardIsAutogradsThroughTheActivationTimesUp) {
  torch::manual_seed(3);
  const auto g = torch::randn({6, 40}, torch::kFloat64) * 3, u = torch::randn({6, 40}, torch::kFloat64);
  const auto up = torch::randn({6, 40}, torch::kFloat64);
  for (const auto& [act, formula] : kGates) {
    const auto fused = run([act = act](auto& in) { return glu(in[0], in[1], act); }, {g, u}, up);
    const auto reference = run([f = formula](auto& in) { return f(in[0]) * in[1]; }, {g, u}, up);
    expect_same(fused, reference);
  }
}

TEST(FusedOps, GluDownIsTheProductThenItsProjection) {
  torch::manual_seed(4);
  // In fp64 against autograd through the formula; in fp32 and bf16 the bits of the ops it
  // replaces (the same products in the same order).
  const auto g = torch::randn({2, 6, 40}, torch::kFloat64) * 3, u = torch::randn({2, 6, 40}, torch::kFloat64);
  const auto w = torch::randn({24, 40}, torch::kFloat64), up = torch::randn({2, 6, 24}, torch::kFloat64);
  for (const auto& [act, formula] : kGates) {
    SCOPED_TRACE(act == GateActivation::Silu ? "silu" : "gelu_tanh");
    const auto down = [act = act](auto& in) { return glu_down(in[0], in[1], in[2], act); };
    expect_same(run(down, {g, u, w}, up),
                run([f = formula](auto& in) { return torch::matmul(f(in[0]) * in[1], in[2].t()); }, {g, u, w}, up));
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const auto fused = run(down, {g.to(dtype), u.to(dtype), w.to(dtype)}, up.to(dtype));
      const auto unfused = run([act = act](auto& in) { return torch::linear(glu(in[0], in[1], act), in[2]); },
                               {g.to(dtype), u.to(dtype), w.to(dtype)}, up.to(dtype));
      EXPECT_TRUE(torch::equal(fused.out, unfused.out)) << dtype;
      for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(fused.inputs[i], unfused.inputs[i])) << dtype << " " << i;
    }
  }
  EXPECT_THROW(glu_down(g, u, w.t(), GateActivation::Silu), c10::Error);
}

TEST(FusedOps, GluDownKeepsNotTheProduct) {
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
  const auto act = GateActivation::Silu;
  EXPECT_EQ(kept([&] { return glu_down(g, u, w, act); }), 0);  // gate, up and the weight exist already
  EXPECT_EQ(kept([&] { return torch::linear(glu(g, u, act), w); }), n * f * 4);  // the product
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

TEST(FusedOps, AWeightWhoseGradientIsThereGetsTheProductSummedIntoItOnce) {
  // A run's weights hold views of the flat fp32 gradient buffer: the matmul nodes sum
  // their weight's gradient straight into it and hand autograd none, while the weight's
  // accumulator still runs (the data-parallel hooks hang on it), once a backward. (An
  // fp32 projection is at::linear itself, whose gradient autograd adds.)
  torch::manual_seed(7);
  const auto x = torch::randn({3, 4, 24}), gate = torch::randn({3, 4, 24}), up = torch::randn({3, 4, 16});
  struct Case {
    std::string name;
    DType compute;
    std::function<torch::Tensor(const torch::Tensor&)> op;
  };
  const std::vector<Case> cases{
      {"projection, bf16", DType::BFloat16, [&](const torch::Tensor& w) { return projection(x, w, {}); }},
      {"glu_down, fp32", DType::Float32,
       [&](const torch::Tensor& w) { return glu_down(gate, x, w, GateActivation::Silu); }},
      {"glu_down (gelu), bf16", DType::BFloat16,
       [&](const torch::Tensor& w) { return glu_down(gate, x, w, GateActivation::GeluTanh); }},
  };
  for (const Case& c : cases) {
    const auto backward_through = [&](const torch::Tensor& w) {
      with_compute_dtype(c.compute, [&] {
        const auto y = c.op(w);
        y.backward(up.to(y.scalar_type()));
        return y;
      });
    };
    auto fresh = torch::randn({16, 24}).requires_grad_();
    backward_through(fresh);  // no .grad before: autograd makes one from the result
    const auto once = fresh.grad().clone();
    auto w = fresh.detach().clone().requires_grad_();
    w.mutable_grad() = torch::zeros_like(w);
    const void* buffer = w.grad().data_ptr();
    int ran = 0, handed = 0;
    const auto accumulator = torch::autograd::impl::grad_accumulator(w);  // held, as the hooks' owners do
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [&](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list& inputs) {
          ++ran;
          handed += inputs[0].defined() ? 1 : 0;
          return outputs;
        }));
    for (int pass = 1; pass <= 2; ++pass) {
      backward_through(w);
      EXPECT_EQ(ran, pass) << c.name;
      EXPECT_EQ(handed, 0) << c.name << ": a gradient went to autograd to be added";
      EXPECT_EQ(w.grad().data_ptr(), buffer) << c.name << ": the gradient stays in the buffer";
      // 0 + p, then p + p: sums that are exact in fp32.
      EXPECT_TRUE(torch::equal(w.grad(), once * pass)) << c.name << " pass " << pass;
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

// A norm and its projections: inputs x, the norm's weight (and a LayerNorm's bias), then
// each projection's weight (and bias), all projections' outputs side by side.
struct NormCase {
  bool layer_norm = false, biased = false;  // biased: the projections have biases
  int projections = 1;
  double eps = 1e-5;
};

std::vector<torch::Tensor> norm_case_inputs(const NormCase& c, torch::Dtype x_dtype) {
  const int64_t d = 16;
  std::vector<torch::Tensor> in{torch::randn({2, 5, d}).mul_(3).to(x_dtype), torch::randn({d}).add_(1)};
  if (c.layer_norm) in.push_back(torch::randn({d}));
  for (int k = 0; k < c.projections; ++k) {
    in.push_back(torch::randn({8 + 4 * k, d}));
    if (c.biased) in.push_back(torch::randn({8 + 4 * k}));
  }
  return in;
}

std::vector<ProjectionWeights> projections_of(const std::vector<torch::Tensor>& in, const NormCase& c) {
  size_t i = c.layer_norm ? 3 : 2;
  std::vector<ProjectionWeights> ps;
  for (int k = 0; k < c.projections; ++k) {
    ProjectionWeights p{in[i++], {}};
    if (c.biased) p.bias = in[i++];
    ps.push_back(p);
  }
  return ps;
}

torch::Tensor normed_case(const std::vector<torch::Tensor>& in, const NormCase& c, ProjectionExchange exchange = {}) {
  const NormWeights norm{in[1], c.layer_norm ? in[2] : torch::Tensor(), c.eps, c.layer_norm};
  return torch::cat(normed_projections(in[0], norm, projections_of(in, c), std::move(exchange)), -1);
}

// As the model ran them before the node: the norm on its own, then each projection.
torch::Tensor norm_then_projections(const std::vector<torch::Tensor>& in, const NormCase& c) {
  const auto& x = in[0];
  const auto y = c.layer_norm ? layer_norm(x, in[1], in[2], c.eps) : rms_norm(x, in[1], c.eps);
  std::vector<torch::Tensor> out;
  for (const auto& p : projections_of(in, c)) out.push_back(projection(y, p.weight, p.bias));
  return torch::cat(out, -1);
}

const std::vector<NormCase> kNormCases{
    {false, false, 3}, {false, true, 3}, {false, false, 2}, {true, true, 1}, {true, true, 2}};

int64_t projected_width(const NormCase& c) { return 8 * c.projections + 4 * c.projections * (c.projections - 1) / 2; }

TEST(FusedOps, NormedProjectionsAreTheNormThenEachProjection) {
  torch::manual_seed(8);
  for (const auto& c : kNormCases) {
    const auto where = ::testing::Message()
                       << "layer_norm " << c.layer_norm << " biased " << c.biased << " x" << c.projections;
    const auto up = torch::randn({2, 5, projected_width(c)});
    // fp64: autograd through the formulas.
    auto in64 = norm_case_inputs(c, torch::kFloat64);
    for (auto& t : in64) t = t.to(torch::kFloat64);
    const auto formula = [&](auto& in) {
      const auto& x = in[0];
      const auto normed = c.layer_norm ? (x - x.mean(-1, true)) *
                                             torch::rsqrt(x.var({-1}, /*unbiased=*/false, /*keepdim=*/true) + c.eps)
                                       : x * torch::rsqrt(x.pow(2).mean(-1, true) + c.eps);
      auto y = normed * in[1];
      if (c.layer_norm) y = y + in[2];
      std::vector<torch::Tensor> out;
      for (const auto& p : projections_of(in, c)) out.push_back(torch::linear(y, p.weight, p.bias));
      return torch::cat(out, -1);
    };
    expect_same(run([&](auto& in) { return normed_case(in, c); }, in64, up.to(torch::kFloat64)),
                run(formula, in64, up.to(torch::kFloat64)));
    // fp32, bf16 compute from a bf16 residual stream, and bf16 with the step's weight
    // copies kept: the bits of the ops it replaces.
    for (const int mode : {0, 1, 2}) {
      const auto in = norm_case_inputs(c, mode == 0 ? torch::kFloat32 : torch::kBFloat16);
      const auto under = [&](auto f) {
        return run(
            [&](auto& ins) {
              if (mode == 0) return f(ins);
              const WeightCastScope step(mode == 2);
              return with_compute_dtype(DType::BFloat16, [&] { return f(ins); });
            },
            in, mode == 0 ? up : up.to(torch::kBFloat16));
      };
      const auto node = under([&](auto& ins) { return normed_case(ins, c); });
      const auto plain = under([&](auto& ins) { return norm_then_projections(ins, c); });
      EXPECT_TRUE(torch::equal(node.out, plain.out)) << where << " mode " << mode;
      // The node sums the projections' input gradients in the GEMM, rounding each partial
      // sum once where autograd rounds the product and then the sum (in bf16 the two
      // differ): the norm's inputs get the gradients of that sum.
      const size_t norm_inputs = c.layer_norm ? 3 : 2;
      std::vector<torch::Tensor> weights;
      for (const auto& p : projections_of(in, c)) weights.push_back(p.weight);
      const NormWeights norm{in[1], c.layer_norm ? in[2] : torch::Tensor(), c.eps, c.layer_norm};
      const auto summed_in_gemm =
          norm_gradients_of_gemm_sum(in[0], norm, weights, mode == 0 ? up : up.to(torch::kBFloat16));
      for (size_t i = 0; i < in.size(); ++i) {
        const auto& want = i < norm_inputs ? summed_in_gemm[i] : plain.inputs[i];
        EXPECT_EQ(node.inputs[i].scalar_type(), want.scalar_type()) << where << " input " << i;
        EXPECT_TRUE(torch::equal(node.inputs[i], want)) << where << " mode " << mode << " input " << i;
      }
    }
  }
}

TEST(FusedOps, NormedProjectionsExchangeTheOutputAndItsGradientAsTheUnfusedOpsWould) {
  torch::manual_seed(9);
  // A reduction that doubles, as two ranks that projected alike would sum (Megatron's f):
  // the gradients of x and the norm's parameters double (exactly: the norm's backward is
  // linear in its upstream gradient), the projections' do not.
  for (const auto& c : kNormCases) {
    const auto in = norm_case_inputs(c, torch::kFloat32);
    const auto up = torch::randn({2, 5, projected_width(c)});
    const auto plain = run([&](auto& ins) { return normed_case(ins, c); }, in, up);
    const ProjectionExchange doubled{{}, [](const at::Tensor& g) { return g * 2; }};
    const auto reduced = run([&](auto& ins) { return normed_case(ins, c, doubled); }, in, up);
    const size_t norm_inputs = c.layer_norm ? 3 : 2;
    for (size_t i = 0; i < in.size(); ++i) {
      const auto want = i < norm_inputs ? plain.inputs[i] * 2 : plain.inputs[i];
      EXPECT_TRUE(torch::equal(reduced.inputs[i], want)) << c.layer_norm << " input " << i;
    }
  }
  // The sequence repeated on its way to the projections, and the gradient's two halves
  // summed on the way back, as an all-gather and a reduce-scatter between two ranks that
  // hold the same part would: the bits of the unfused ops, the copy made by autograd.
  for (const auto& c : kNormCases) {
    const auto in = norm_case_inputs(c, torch::kFloat32);
    const auto up = torch::randn({2, 10, projected_width(c)});
    const ProjectionExchange twice{[](const at::Tensor& y) {
                                     return torch::cat({y, y}, 1);
                                   },
                                   [](const at::Tensor& g) { return g.narrow(1, 0, 5) + g.narrow(1, 5, 5); }};
    const auto node = run([&](auto& ins) { return normed_case(ins, c, twice); }, in, up);
    const auto apart = run(
        [&](auto& ins) {
          const auto& x = ins[0];
          const auto y = c.layer_norm ? layer_norm(x, ins[1], ins[2], c.eps) : rms_norm(x, ins[1], c.eps);
          const auto both = torch::cat({y, y}, 1);
          std::vector<torch::Tensor> out;
          for (const auto& p : projections_of(ins, c)) out.push_back(projection(both, p.weight, p.bias));
          return torch::cat(out, -1);
        },
        in, up);
    EXPECT_TRUE(torch::equal(node.out, apart.out)) << c.layer_norm;
    for (size_t i = 0; i < in.size(); ++i)
      EXPECT_TRUE(torch::equal(node.inputs[i], apart.inputs[i])) << c.layer_norm << " input " << i;
  }
}

TEST(FusedOps, NormedProjectionsKeepTheResidualStreamNotTheNormsOutput) {
  count_host_tensor_memory();
  torch::manual_seed(10);
  const int64_t n = 128, d = 256;
  const auto x = torch::randn({n, d}, torch::kBFloat16).requires_grad_();
  const auto w = torch::ones({d}).requires_grad_();
  const auto q = torch::randn({d, d}).requires_grad_(), k = torch::randn({64, d}).requires_grad_();
  // What a bf16 forward leaves alive beyond its outputs: what its graph keeps for backward.
  const auto kept = [&](auto fn) {
    const int64_t before = host_tensor_bytes();
    const auto out = with_compute_dtype(DType::BFloat16, fn);
    return host_tensor_bytes() - before - (n * d + n * 64) * 2;
  };
  const auto node = kept([&] {
    return torch::cat(normed_projections(x, {w, {}, 1e-6, false}, {{q, {}}, {k, {}}}), -1);
  });
  EXPECT_EQ(node, 0);  // x and the parameters exist already
  const auto plain = kept([&] {
    const auto y = rms_norm(x, w, 1e-6);
    return torch::cat({projection(y, q, {}), projection(y, k, {})}, -1);
  });
  // The norm's fp32 copy of x and its statistic, and its output, which the projections keep.
  EXPECT_EQ(plain - node, n * d * 4 + n * 4 + n * d * 2);
}

TEST(FusedOps, NormedProjectionsHandTheResidualStreamOnAndJoinItsGradient) {
  torch::manual_seed(17);
  for (const auto& c : {NormCase{false, false, 2}, NormCase{true, true, 1}}) {
    const auto up = torch::randn({2, 5, projected_width(c)}), up_residual = torch::randn({2, 5, 16});
    const auto with_residual = [&](auto& in) {
      const NormWeights norm{in[1], c.layer_norm ? in[2] : torch::Tensor(), c.eps, c.layer_norm};
      auto out = normed_projections(in[0], norm, projections_of(in, c), {}, /*residual_out=*/true);
      EXPECT_TRUE(torch::equal(out.back(), in[0]));
      return out;
    };
    // fp64: the extra output is x itself, its gradient x's beside the norm's.
    auto in64 = norm_case_inputs(c, torch::kFloat64);
    for (auto& t : in64) t = t.to(torch::kFloat64);
    const auto both = torch::cat({up, up_residual}, -1).to(torch::kFloat64);
    const auto side_by_side = [&](auto f) {
      return [f](auto& in) {
        auto out = f(in);
        return torch::cat(out, -1);
      };
    };
    expect_same(run(side_by_side(with_residual), in64, both), run(side_by_side([&](auto& in) {
                                                                    std::vector<torch::Tensor> out{normed_case(in, c)};
                                                                    out.push_back(in[0]);
                                                                    return out;
                                                                  }),
                                                                  in64, both));
    // fp32: x's gradient is the node's without the residual plus the residual's, added
    // before it leaves the node; the other inputs' are the node's without it.
    const auto in = norm_case_inputs(c, torch::kFloat32);
    const auto joined = run(side_by_side(with_residual), in, torch::cat({up, up_residual}, -1));
    const auto alone = run([&](auto& ins) { return normed_case(ins, c); }, in, up);
    EXPECT_TRUE(torch::equal(joined.inputs[0], alone.inputs[0] + up_residual)) << c.layer_norm;
    for (size_t i = 1; i < in.size(); ++i) EXPECT_TRUE(torch::equal(joined.inputs[i], alone.inputs[i])) << i;
  }
}

TEST(FusedOps, TheCpuTakesLibTorchsOps) {
  EXPECT_FALSE(fused_kernels_take(torch::ones({2})));
  auto logits = torch::zeros({2, 3});
  EXPECT_THROW(cross_entropy_rows_(logits, torch::zeros({2}, torch::kLong), false), c10::Error);
}

}  // namespace
}  // namespace tide
