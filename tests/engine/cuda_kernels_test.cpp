// tide's CUDA kernels (engine/src/kernels) against the LibTorch ops the CPU runs for the
// same fused op, from the same inputs: forward and backward, fp32 and bf16. Every test
// skips where no CUDA device is present (ctest label `cuda`). The same tests also run in
// the emulation build (TIDE_CUDA_EMULATION, tests/kernels): there the kernels' device is
// the CPU, whose tensors the fused ops hand to the emulated kernels while a scope is open,
// and the suite is EmulatedCuda (ctest label `kernels`).
//
// The bounds: fp32 results differ by the order of their sums (at most n u sum|terms| for
// n terms, u = 2^-24, counted in each test) and by the fast exponential the kernels use
// (a few ulp: under 1e-6 relative for the arguments here, bounded by 1e-5); bf16 results
// are each one rounding of such fp32 values, so two may differ by one bf16 step: 2^-7 of
// their magnitude.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "normed_projections_reference.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/fused_ops.h"
#include "tide/engine/model/linear_cross_entropy.h"
#include "tide/engine/optim/adamw.h"
#ifdef TIDE_CUDA_EMULATION
#include "cuda_emulation.h"
#else
#include "cuda_skip.h"
#endif

namespace tide {
namespace {

// Rows where a test wants many: the emulation runs a block's threads one after another,
// so it takes fewer (still more than the RMSNorm backward's 1024 partial sums; still two
// chunks of the loss, one part).
#ifdef TIDE_CUDA_EMULATION
constexpr int64_t kNormRows = 1100, kNormedRows = 64, kLossRows = 150;
#else
constexpr int64_t kNormRows = 3000, kNormedRows = 256, kLossRows = 300;
#endif

#ifdef TIDE_CUDA_EMULATION
#define KERNEL_TEST(name) TEST(EmulatedCuda, name)
#define SKIP_WITHOUT_KERNEL_DEVICE() (void)0
const torch::Device kCuda(torch::kCPU);
// While one is open, the fused ops and AdamW hand the CPU's tensors to the emulated kernels.
using KernelDeviceScope = cuda_emulation::EmulatedKernelsScope;
// Runs f with the fused ops handing the CPU's tensors to the emulated kernels.
template <typename F>
auto on_kernels(F f) {
  cuda_emulation::EmulatedKernelsScope scope;
  return f();
}
#else
#define KERNEL_TEST(name) TEST(Cuda, name)
#define SKIP_WITHOUT_KERNEL_DEVICE() SKIP_WITHOUT_CUDA()
const torch::Device kCuda(torch::kCUDA, 0);
struct KernelDeviceScope {};
template <typename F>
auto on_kernels(F f) {
  return f();
}
#endif

// |cuda - cpu| <= rel * scale elementwise (scale: the magnitudes the result is made of).
void expect_within(const torch::Tensor& cuda, const torch::Tensor& cpu, const torch::Tensor& scale, double rel,
                   const std::string& what) {
  ASSERT_EQ(cuda.sizes(), cpu.sizes()) << what;
  const auto diff = (cuda.to(torch::kCPU).to(torch::kFloat64) - cpu.to(torch::kFloat64)).abs();
  const auto bound = scale.to(torch::kFloat64) * rel + 1e-30;
  const auto worst = (diff - bound).max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": largest excess over the bound " << worst;
}

constexpr double kUnitFp32 = 1.0 / (1 << 24);

// Elementwise results: fp32 within 1e-5 (the fast exponential's few ulp and a few
// roundings); bf16 within one bf16 step (2^-7) beside that.
double rel_for(torch::ScalarType t) { return t == torch::kFloat32 ? 1e-5 : 1.0 / 128 + 1e-5; }

struct Outcome {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;
};

template <typename F>
Outcome run_on(const torch::Device& device, F f, const std::vector<torch::Tensor>& inputs,
               const torch::Tensor& upstream) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.to(device).detach().requires_grad_());
  const auto out = f(leaves);
  out.backward(upstream.to(device).to(out.scalar_type()));
  Outcome o{out.detach().to(torch::kCPU), {}};
  for (const auto& l : leaves) o.grads.push_back(l.grad().to(torch::kCPU));
  return o;
}

// The same through tide's kernels: on kCuda, with the emulation's scope open there.
template <typename F>
Outcome run_on_kernels(F f, const std::vector<torch::Tensor>& inputs, const torch::Tensor& upstream) {
  return on_kernels([&] { return run_on(kCuda, f, inputs, upstream); });
}

KERNEL_TEST(RmsNormKernelEqualsLibTorchsOps) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  // 1000 columns: whole 16-byte packs, a row per warp; 2500: more than a warp's
  // registers hold, a row per block.
  for (const int64_t cols : {1000, 2500}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      torch::manual_seed(11);
      // More rows than the backward's 1024 partial sums, a width no power of two.
      const auto x = (torch::randn({kNormRows, cols}) * 2).to(dtype), w = torch::randn({cols});
      const auto up = torch::randn({kNormRows, cols}).to(dtype);
      auto f = [](std::vector<torch::Tensor>& in) { return rms_norm(in[0], in[1], 1e-5); };
      const auto gpu = run_on_kernels(f, {x, w}, up);
      const auto cpu = run_on(torch::kCPU, f, {x, w}, up);
      const std::string what = std::to_string(cols) + " columns, " + std::string(c10::toString(dtype)) + ": ";
      // A row's sum of squares over its columns: r differs by at most (cols + 4) u.
      const double sums = static_cast<double>(cols + 4) * kUnitFp32;
      const double rel = rel_for(dtype) + sums;
      expect_within(gpu.out, cpu.out, cpu.out.abs(), rel, what + "y");
      // dx = r (g w - xn mean(g w xn)): scaled by its two terms' magnitudes.
      const auto r = torch::rsqrt(x.to(torch::kFloat64).pow(2).mean(-1, true) + 1e-5);
      const auto gw = (up.to(torch::kFloat64) * w.to(torch::kFloat64)).abs();
      const auto xn = x.to(torch::kFloat64).abs() * r;
      expect_within(gpu.grads[0], cpu.grads[0], (gw + xn * (gw * xn).mean(-1, true)) * r, rel + sums, what + "dx");
      // dw sums the rows in fp32 on both sides, in other orders.
      const auto dw_terms = (up.to(torch::kFloat64) * x.to(torch::kFloat64) * r).abs().sum(0);
      expect_within(gpu.grads[1], cpu.grads[1], dw_terms, static_cast<double>(kNormRows + 4) * kUnitFp32 + sums,
                    what + "dw");
    }
  }
}

KERNEL_TEST(NormedProjectionsAreTheKernelNormThenItsProjections) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  // The node remakes the norm's output in backward with the same kernel and multiplies by
  // the same cuBLAS products as rms_norm then projection: the same bits, in fp32 and from a
  // bf16 residual stream under bf16 compute. The norm's output gradient is the projections'
  // summed in the GEMM (normed_projections_reference.h).
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(14);
    const auto x = (torch::randn({4, kNormedRows / 4, 256}) * 2).to(dtype), w = torch::randn({256});
    const auto q = torch::randn({256, 256}) / 16, k = torch::randn({128, 256}) / 16;
    const auto up = torch::randn({4, kNormedRows / 4, 384}).to(dtype);
    const auto compute = dtype == torch::kFloat32 ? DType::Float32 : DType::BFloat16;
    auto node = [&](std::vector<torch::Tensor>& in) {
      return with_compute_dtype(compute, [&] {
        return torch::cat(normed_projections(in[0], {in[1], {}, 1e-5, false}, {{in[2], {}}, {in[3], {}}}), -1);
      });
    };
    auto apart = [&](std::vector<torch::Tensor>& in) {
      return with_compute_dtype(compute, [&] {
        const auto y = rms_norm(in[0], in[1], 1e-5);
        return torch::cat({projection(y, in[2], {}), projection(y, in[3], {})}, -1);
      });
    };
    const auto fused = run_on_kernels(node, {x, w, q, k}, up);
    const auto unfused = run_on_kernels(apart, {x, w, q, k}, up);
    EXPECT_TRUE(torch::equal(fused.out, unfused.out)) << dtype;
    const auto norm_grads = on_kernels([&] {
      return norm_gradients_of_gemm_sum(x.to(kCuda), {w.to(kCuda), {}, 1e-5, false}, {q.to(kCuda), k.to(kCuda)},
                                        up.to(kCuda));
    });
    for (size_t i = 0; i < 4; ++i) {
      const auto want = i < 2 ? norm_grads[i].to(torch::kCPU) : unfused.grads[i];
      EXPECT_TRUE(torch::equal(fused.grads[i], want)) << dtype << " input " << i;
    }
  }
}

KERNEL_TEST(NormedProjectionsJoinTheResidualsGradientInTheNormsPass) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  // With the residual stream handed on (residual_out), x's gradient is the norm's plus
  // the stream's, summed in the norm's backward kernel before it is rounded: within two
  // roundings (2 steps) of the node's gradient without it plus the stream's; the
  // parameters' gradients are the same bits. 256 columns: the warp kernel; 2500: a block
  // a row.
  for (const int64_t cols : {256, 2500}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      torch::manual_seed(15);
      const auto x = (torch::randn({4, kNormedRows / 4, cols}) * 2).to(dtype), w = torch::randn({cols});
      const auto q = torch::randn({96, cols}) / 16;
      const auto up = torch::randn({4, kNormedRows / 4, 96}).to(dtype);
      const auto up_residual = torch::randn({4, kNormedRows / 4, cols}).to(dtype);
      const auto compute = dtype == torch::kFloat32 ? DType::Float32 : DType::BFloat16;
      const auto node = [&](bool residual_out) {
        return [&, residual_out](std::vector<torch::Tensor>& in) {
          return with_compute_dtype(compute, [&] {
            return torch::cat(normed_projections(in[0], {in[1], {}, 1e-5, false}, {{in[2], {}}}, {}, residual_out), -1);
          });
        };
      };
      const auto joined = run_on_kernels(node(true), {x, w, q}, torch::cat({up, up_residual}, -1));
      const auto alone = run_on_kernels(node(false), {x, w, q}, up);
      const std::string what = std::to_string(cols) + " columns, " + std::string(c10::toString(dtype)) + ": ";
      const auto sum = alone.grads[0].to(torch::kFloat64) + up_residual.to(torch::kFloat64);
      expect_within(joined.grads[0], sum,
                    alone.grads[0].to(torch::kFloat64).abs() + up_residual.to(torch::kFloat64).abs(),
                    2 * rel_for(dtype), what + "dx");
      for (size_t i = 1; i < 3; ++i)
        EXPECT_TRUE(torch::equal(joined.grads[i], alone.grads[i])) << what << "input " << i;
    }
  }
}

// What the rounding errors of a gated activation's value and slope scale with, for gates
// g (fp64): silu's |g| and 1 + |g| (s (1 + g (1 - s)), s in (0, 1)); for gelu's tanh form
// also the cancellation in 1 + t as g goes negative, where t = tanh(b (g + k g^3)) is
// off by an ulp of itself plus its argument's relative error times its slope 1 - t^2
// (the kernels' bound, tests/kernels/glu_kernel_test.cpp).
struct GateMagnitudes {
  torch::Tensor value, slope;
};

GateMagnitudes gate_magnitudes(GateActivation act, const torch::Tensor& g) {
  const auto a = g.abs();
  if (act == GateActivation::Silu) return {a, 1 + a};
  const double b = std::sqrt(2.0 / M_PI), k = 0.044715;
  const auto arg = b * (g + k * g.pow(3)), t = arg.tanh(), dt = 1 - t * t;
  const auto t_error = 1 + dt * arg.abs(), outer = 0.5 * a * b * (1 + 3 * k * g * g);
  return {0.5 * a * (1 + t.abs() + t_error), 0.5 * (1 + t.abs() + t_error) + outer * (1 + 2 * t_error)};
}

const char* gate_name(GateActivation act) { return act == GateActivation::Silu ? "silu" : "gelu_tanh"; }

KERNEL_TEST(GluKernelEqualsLibTorchsOps) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  // 257 x 300 elements: no whole number of bf16 packs, one at a time; 256 x 512: packs.
  for (const auto act : {GateActivation::Silu, GateActivation::GeluTanh})
    for (const auto& shape : {std::vector<int64_t>{257, 300}, std::vector<int64_t>{256, 512}}) {
      for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
        torch::manual_seed(12);
        const auto g = (torch::randn(shape) * 4).to(dtype), u = torch::randn(shape).to(dtype);
        const auto up = torch::randn(shape).to(dtype);
        auto f = [act](std::vector<torch::Tensor>& in) { return glu(in[0], in[1], act); };
        const auto gpu = run_on_kernels(f, {g, u}, up);
        const auto cpu = run_on(torch::kCPU, f, {g, u}, up);
        const std::string what = std::string(gate_name(act)) + ", " + std::to_string(shape[1]) + " columns, " +
                                 std::string(c10::toString(dtype)) + ": ";
        const double rel = rel_for(dtype);
        const auto d = up.to(torch::kFloat64).abs(), ud = u.to(torch::kFloat64).abs();
        const auto m = gate_magnitudes(act, g.to(torch::kFloat64));
        expect_within(gpu.out, cpu.out, m.value * ud, rel, what + "out");
        expect_within(gpu.grads[0], cpu.grads[0], d * ud * m.slope, rel, what + "d_gate");
        expect_within(gpu.grads[1], cpu.grads[1], d * m.value, rel, what + "d_up");
      }
    }
}

KERNEL_TEST(GluDownRemakesTheProductInTheGradientsPass) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  // On CUDA the backward remakes the product in the pass that makes the gate's gradient
  // (over the product's gradient) and up's; on the CPU LibTorch's ops. 129 x 300 elements:
  // no whole number of bf16 packs, one at a time; 129 x 512: packs. The weight is fp32,
  // multiplied by its working copy.
  for (const auto act : {GateActivation::Silu, GateActivation::GeluTanh})
    for (const int64_t cols : {300, 512}) {
      for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
        torch::manual_seed(13);
        const int64_t out_features = 96, rows = 129;  // 3 x 43
        const auto g = (torch::randn({3, 43, cols}) * 4).to(dtype), u = torch::randn({3, 43, cols}).to(dtype);
        const auto w = torch::randn({out_features, cols}) / std::sqrt(static_cast<double>(cols));
        const auto up = torch::randn({3, 43, out_features}).to(dtype);
        auto f = [act](std::vector<torch::Tensor>& in) { return glu_down(in[0], in[1], in[2], act); };
        const auto gpu = run_on_kernels(f, {g, u, w}, up);
        const auto cpu = run_on(torch::kCPU, f, {g, u, w}, up);
        const std::string what = std::string(gate_name(act)) + ", " + std::to_string(cols) + " columns, " +
                                 std::string(c10::toString(dtype)) + ": ";
        // Counted in roundings to the element type, each within half a step of its value
        // (step: rel_for). The product: the kernel rounds it once, the CPU's ops twice (the
        // activation, then the product): 1.5 steps apart. The output: that, and each side's
        // rounding of its GEMM sum: 2.5 steps. The gate's and up's gradients: the product's
        // gradient rounded by each side's GEMM (1 step), then the kernel rounds once, the
        // CPU's ops twice (d u or act(g) first): 2.5 steps. The weight's fp32 gradient sums
        // rows of the products: 1.5 steps. Beside each, the sums' (k + 4) u in either order.
        const double step = rel_for(dtype);
        const auto sums = [](int64_t k) { return static_cast<double>(k + 4) * kUnitFp32; };
        const auto g64 = g.to(torch::kFloat64), u64 = u.to(torch::kFloat64), dy = up.to(torch::kFloat64).abs();
        const auto m = gate_magnitudes(act, g64);
        const auto p = m.value * u64.abs(), w64 = w.to(torch::kFloat64).abs();
        expect_within(gpu.out, cpu.out, torch::matmul(p, w64.t()), 2.5 * step + sums(cols), what + "out");
        const auto d_p = torch::matmul(dy, w64);  // the product's gradient's magnitudes
        expect_within(gpu.grads[0], cpu.grads[0], d_p * u64.abs() * m.slope, 2.5 * step + sums(out_features),
                      what + "d_gate");
        expect_within(gpu.grads[1], cpu.grads[1], d_p * m.value, 2.5 * step + sums(out_features), what + "d_up");
        ASSERT_EQ(gpu.grads[2].scalar_type(), torch::kFloat32) << what;
        expect_within(gpu.grads[2], cpu.grads[2],
                      torch::matmul(dy.reshape({rows, out_features}).t(), p.reshape({rows, cols})),
                      1.5 * step + sums(rows), what + "d_weight");
      }
    }
}

KERNEL_TEST(RotaryKernelEqualsLibTorchsOpsOnTheAttentionsLayout) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  // A head of 64: its halves are whole packs; of 20: one pair at a time.
  for (const int64_t hd : {64, 20})
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      torch::manual_seed(13);
      const int64_t b = 2, h = 4, t = 33;
      const auto angle = torch::randn({t, hd / 2}) * 3;
      const auto emb = torch::cat({angle, angle}, -1);
      const auto cos = emb.cos().to(dtype), sin = emb.sin().to(dtype);
      const auto x = torch::randn({b, t, h, hd}).to(dtype);
      const auto up = torch::randn({b, h, t, hd}).to(dtype);
      // q as the attention makes it: a [B, H, T, Hd] view of [B, T, H, Hd] memory.
      auto f = [&](std::vector<torch::Tensor>& in) {
        return rotary(in[0].transpose(1, 2), cos.to(in[0].device()), sin.to(in[0].device()));
      };
      const auto gpu = run_on_kernels(f, {x}, up);
      const auto cpu = run_on(torch::kCPU, f, {x}, up);
      const double rel = rel_for(dtype);
      // Each output is a c + b s of one pair: scale by |a| + |b|.
      const auto xt = x.transpose(1, 2).to(torch::kFloat64).abs();
      const auto pair = xt + torch::cat({xt.narrow(-1, hd / 2, hd / 2), xt.narrow(-1, 0, hd / 2)}, -1);
      expect_within(gpu.out, cpu.out, pair, rel, "head " + std::to_string(hd) + ": y");
      const auto ut = up.to(torch::kFloat64).abs();
      const auto upair = ut + torch::cat({ut.narrow(-1, hd / 2, hd / 2), ut.narrow(-1, 0, hd / 2)}, -1);
      expect_within(gpu.grads[0], cpu.grads[0], upair.transpose(1, 2), rel, "head " + std::to_string(hd) + ": dx");
    }
}

KERNEL_TEST(CrossEntropyKernelEqualsLibTorchsOpsInTheFusedLoss) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  // A vocabulary of 5000: rows of whole packs; of 4999: an element at a time.
  for (const int64_t v : {5000, 4999})
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      torch::manual_seed(14);
      const int64_t n = kLossRows, d = 64;
      const auto h = (torch::randn({n, d}) * 0.3).to(dtype), w = (torch::randn({v, d}) * 0.3).to(dtype);
      auto targets = torch::randint(0, v, {n}, torch::kInt64);
      // Uncounted rows (data.eod_mask_loss): every fifth, and the first 20 of the second
      // chunk; the mean is over the others.
      const auto uncounted = torch::arange(n).remainder(5).eq(0).logical_or(
          torch::arange(n).ge(128).logical_and(torch::arange(n).lt(148)));
      const auto counted = uncounted.logical_not().to(torch::kFloat64).unsqueeze(1);
      const double n_counted = counted.sum().item<double>();
      targets.masked_fill_(uncounted, kUncountedTarget);
      // Chunks of 128 rows: whole ones and a part.
      auto f = [&](std::vector<torch::Tensor>& in) {
        return linear_cross_entropy(in[0], in[1], targets.to(in[0].device()), {}, 128);
      };
      const auto up = torch::full({}, 3.0);
      const auto gpu = run_on_kernels(f, {h, w}, up);
      const auto cpu = run_on(torch::kCPU, f, {h, w}, up);
      EXPECT_EQ(gpu.out.scalar_type(), torch::kFloat32) << "vocabulary " << v;
      // cuBLAS and the CPU's bf16 products may round a logit to neighbouring bf16 values
      // (fp32 ones differ by their sums' order): each logit moves by at most delta, the loss
      // by at most 2 delta and every probability by a factor within 1 +- 2 delta.
      const auto logits = torch::mm(h.to(torch::kFloat64), w.to(torch::kFloat64).t());
      const double max_logit = logits.abs().max().item<double>();
      const double max_terms =
          torch::mm(h.to(torch::kFloat64).abs(), w.to(torch::kFloat64).abs().t()).max().item<double>();
      const double delta = (d + 2) * kUnitFp32 * max_terms + (dtype == torch::kFloat32 ? 0.0 : max_logit / 128);
      // The mean over the counted rows in fp32, summed in other orders: n u of the rows' losses.
      const double mean_sum = n * kUnitFp32 * (std::log(static_cast<double>(v)) + 2 * max_logit);
      EXPECT_NEAR(gpu.out.item<double>(), cpu.out.item<double>(), 2 * delta + mean_sum) << "vocabulary " << v;
      const double rel = rel_for(dtype) + 2 * delta;
      // Gradients: sums of (p + one-hot) |w or h| * 3 / counted terms of the counted rows;
      // an uncounted row's gradient of h is 0 on both sides.
      const auto probs = torch::softmax(logits, 1);
      const auto terms =
          (probs + torch::one_hot(targets.clamp_min(0), v).to(torch::kFloat64)) * counted * (3.0 / n_counted);
      expect_within(gpu.grads[0], cpu.grads[0], terms.mm(w.to(torch::kFloat64).abs()), rel,
                    "vocabulary " + std::to_string(v) + ": dh");
      EXPECT_TRUE(gpu.grads[0].index({uncounted}).eq(0).all().item<bool>()) << "vocabulary " << v;
      expect_within(gpu.grads[1], cpu.grads[1], terms.t().mm(h.to(torch::kFloat64).abs()), rel,
                    "vocabulary " + std::to_string(v) + ": dw");
    }
}

KERNEL_TEST(CrossEntropyKernelGivesNaNForATargetOutsideTheVocabulary) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  auto logits = torch::randn({2, 10}, torch::TensorOptions(kCuda));
  const auto loss = on_kernels([&] {
    return cross_entropy_rows_(logits, torch::tensor({3, 10}, torch::kInt64).to(kCuda), false).to(torch::kCPU);
  });
  EXPECT_TRUE(std::isfinite(loss[0].item<float>()));
  EXPECT_TRUE(std::isnan(loss[1].item<float>()));
}

// tide's AdamW kernel against the host kernel: one launch over ranges whose offsets allow
// 16-byte moves and one whose do not, across chunk boundaries, decayed and plain; clipped,
// skipped, and with the rate a device scalar. Each operation is rounded as the host
// rounds it (neither contracts a multiply-add; the step's factors are formed in double
// by both): the same bits. The working copy it writes is the result, cast.
KERNEL_TEST(AdamWKernelGivesTheHostKernelsBitsAndWritesTheWorkingCopy) {
  SKIP_WITHOUT_KERNEL_DEVICE();
  const int64_t n = 200003;
  // The first range 16 bytes at a time, ending past a multiple of 4; the second one
  // element at a time; the third aligned again, over two chunks.
  const std::vector<OptimSegment> segments{
      {0, 0, 70001, true, true}, {70001, 70001, 3, false, true}, {70004, 70004, n - 70004, true, true}};
  OptimConfig o;
  o.weight_decay = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  torch::manual_seed(21);
  [[maybe_unused]] const KernelDeviceScope kernel_device;
  auto p_host = torch::randn({n});
  auto p_cuda = p_host.to(kCuda, /*non_blocking=*/false, /*copy=*/true);  // kCuda is the CPU in the emulation
  auto g_host = torch::zeros({n});
  auto g_cuda = g_host.to(kCuda, /*non_blocking=*/false, /*copy=*/true);
  AdamW host(p_host, g_host, segments, o, false, AdamWKernel::host);
  AdamW cuda(p_cuda, g_cuda, segments, o, false, AdamWKernel::device);
  ASSERT_TRUE(cuda.runs_on_device());
  const auto slots_of = [&](const torch::Tensor& p) {
    std::vector<FlatParameters::Slot> slots;
    for (const auto& s : segments) {
      FlatParameters::Slot slot;
      slot.offset = s.param_offset;
      slot.numel = s.numel;
      slot.shape = {s.numel};
      slot.param = p.narrow(0, s.param_offset, s.numel);
      slots.push_back(slot);
    }
    return slots;
  };
  const auto host_slots = slots_of(p_host), cuda_slots = slots_of(p_cuda);
  ASSERT_TRUE(host.keep_working_copy(torch::kBFloat16, host_slots));
  ASSERT_TRUE(cuda.keep_working_copy(torch::kBFloat16, cuda_slots));
  for (int step = 0; step < 5; ++step) {
    const auto g = torch::randn({n}) * (step + 1);
    g_host.copy_(g);
    g_cuda.copy_(g);
    const double rate = std::ldexp(1.0, -6 - step % 2);  // exact in the fp32 the kernel reads
    UpdateGate gate;
    if (step >= 1) gate.clip = torch::full({}, 0.5, torch::kFloat64);
    if (step == 2) gate.skip = torch::full({}, true);
    host.step(rate, gate);
    UpdateGate on_cuda{gate.clip.defined() ? gate.clip.to(kCuda) : torch::Tensor(),
                       gate.skip.defined() ? gate.skip.to(kCuda) : torch::Tensor()};
    if (step == 4)
      cuda.step(torch::full({}, rate, torch::TensorOptions(kCuda).dtype(torch::kFloat64)), on_cuda);
    else
      cuda.step(rate, on_cuda);
    const std::string at = "step " + std::to_string(step);
    EXPECT_TRUE(torch::equal(p_cuda.cpu(), p_host)) << at;
    EXPECT_TRUE(torch::equal(cuda.exp_avg().cpu(), host.exp_avg())) << at;
    EXPECT_TRUE(torch::equal(cuda.exp_avg_sq().cpu(), host.exp_avg_sq())) << at;
    for (size_t k = 0; k < segments.size(); ++k) {
      const auto copy = working_copy(cuda_slots[k].param, torch::kBFloat16);
      EXPECT_TRUE(torch::equal(copy.cpu(), cuda_slots[k].param.cpu().to(torch::kBFloat16))) << at << " range " << k;
      EXPECT_TRUE(torch::equal(copy.cpu(), working_copy(host_slots[k].param, torch::kBFloat16)))
          << at << " range " << k;
    }
  }
  EXPECT_EQ(cuda.steps_taken(), 4);
  EXPECT_EQ(host.steps_taken(), 4);
}

}  // namespace
}  // namespace tide
