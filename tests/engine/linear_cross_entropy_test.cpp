#include <gtest/gtest.h>
#include <torch/types.h>

#include "tide/engine/model/linear_cross_entropy.h"
#include "tide/engine/train/tensor_memory.h"

namespace tide {
namespace {

struct Reference {
  torch::Tensor loss, grad_h, grad_w;
};

// The unfused ops in fp64, under an upstream gradient of 3 (other than one); with a cap,
// of the logits cap * tanh(logit / cap).
Reference reference(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& targets, double cap = 0) {
  auto h2 = h.to(torch::kFloat64, false, true).requires_grad_();
  auto w2 = w.to(torch::kFloat64, false, true).requires_grad_();
  auto logits = torch::mm(h2, w2.t());
  if (cap > 0) logits = (logits / cap).tanh() * cap;
  auto loss = torch::cross_entropy_loss(logits, targets);
  (loss * 3.0).backward();
  return {loss.detach(), h2.grad(), w2.grad()};
}

TEST(LinearCrossEntropy, EqualsProjectionThenCrossEntropyInEveryChunking) {
  torch::manual_seed(4);
  const auto h0 = torch::randn({37, 16}, torch::kFloat64), w0 = torch::randn({53, 16}, torch::kFloat64);
  const auto targets = torch::randint(0, 53, {37}, torch::kInt64);
  const auto ref = reference(h0, w0, targets);
  // One chunk, chunks that divide nothing evenly, one row a chunk.
  for (const int64_t chunk : {int64_t{0}, int64_t{5}, int64_t{1}}) {
    auto h1 = h0.clone().requires_grad_(), w1 = w0.clone().requires_grad_();
    const auto loss = linear_cross_entropy(h1, w1, targets, {}, chunk);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat64);
    EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-12) << "chunk " << chunk;
    (loss * 3.0).backward();
    EXPECT_TRUE(torch::allclose(h1.grad(), ref.grad_h, 1e-10, 1e-12)) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(w1.grad(), ref.grad_w, 1e-10, 1e-12)) << "chunk " << chunk;
  }
}

// Uncounted targets (data.eod_mask_loss) add nothing to the loss, to its mean's count or
// to any gradient: the loss is cross_entropy with ignore_index -100, in every chunking,
// a chunk of none counted among them; soft-capped too. None counted at all: a loss of 0
// and zero gradients, not 0 / 0.
TEST(LinearCrossEntropy, UncountedTargetsAreLeftOutOfTheLossItsMeanAndItsGradients) {
  static_assert(kUncountedTarget == -100, "PyTorch's default ignore_index");
  torch::manual_seed(6);
  const auto h0 = torch::randn({37, 16}, torch::kFloat64) * 0.5, w0 = torch::randn({53, 16}, torch::kFloat64);
  auto targets = torch::randint(0, 53, {37}, torch::kInt64);
  const auto uncounted = torch::arange(37).remainder(4).eq(1).logical_or(torch::arange(37).ge(30));
  targets.masked_fill_(uncounted, kUncountedTarget);
  for (const double cap : {0.0, 3.0}) {
    const auto ref = reference(h0, w0, targets, cap);
    ASSERT_GT(std::abs(ref.loss.item<double>() - reference(h0, w0, targets.clamp_min(0), cap).loss.item<double>()),
              1e-3);
    for (const int64_t chunk : {int64_t{0}, int64_t{5}, int64_t{7}, int64_t{1}}) {
      auto h1 = h0.clone().requires_grad_(), w1 = w0.clone().requires_grad_();
      const auto loss = linear_cross_entropy(h1, w1, targets, {}, chunk, cap);
      EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-12) << "chunk " << chunk << ", cap " << cap;
      (loss * 3.0).backward();
      EXPECT_TRUE(torch::allclose(h1.grad(), ref.grad_h, 1e-10, 1e-12)) << "chunk " << chunk << ", cap " << cap;
      EXPECT_TRUE(h1.grad().index({uncounted}).eq(0).all().item<bool>()) << "chunk " << chunk;
      EXPECT_TRUE(torch::allclose(w1.grad(), ref.grad_w, 1e-10, 1e-12)) << "chunk " << chunk << ", cap " << cap;
    }
  }
  auto h1 = h0.clone().requires_grad_(), w1 = w0.clone().requires_grad_();
  const auto none = torch::full({37}, kUncountedTarget, torch::kInt64);
  const auto loss = linear_cross_entropy(h1, w1, none, {}, 5);
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_TRUE(h1.grad().eq(0).all().item<bool>());
  EXPECT_TRUE(w1.grad().eq(0).all().item<bool>());
}

// Gemma 2's final soft-cap: the loss of cap * tanh(logits / cap), its gradients through
// tanh's slope, in every chunking; a cap far above the logits is no cap to fp64's
// resolution, and a cap the logits reach changes the loss.
TEST(LinearCrossEntropy, SoftCappedLogitsGiveTheLossAndGradientsOfTheCappedFormula) {
  torch::manual_seed(14);
  // Logits of about |h||w| = 2 * 4 = 8: a cap of 3 bends them.
  const auto h0 = torch::randn({37, 16}, torch::kFloat64) * 0.5, w0 = torch::randn({53, 16}, torch::kFloat64);
  const auto targets = torch::randint(0, 53, {37}, torch::kInt64);
  const auto ref = reference(h0, w0, targets, 3.0);
  for (const int64_t chunk : {int64_t{0}, int64_t{5}, int64_t{1}}) {
    auto h1 = h0.clone().requires_grad_(), w1 = w0.clone().requires_grad_();
    const auto loss = linear_cross_entropy(h1, w1, targets, {}, chunk, 3.0);
    EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-12) << "chunk " << chunk;
    (loss * 3.0).backward();
    EXPECT_TRUE(torch::allclose(h1.grad(), ref.grad_h, 1e-10, 1e-12)) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(w1.grad(), ref.grad_w, 1e-10, 1e-12)) << "chunk " << chunk;
  }
  EXPECT_GT(std::abs(ref.loss.item<double>() - reference(h0, w0, targets).loss.item<double>()), 0.1);
  // cap tanh(z / cap) = z - z^3 / (3 cap^2) + ...: at cap 1e7 and |z| < 30, within 1e-11.
  EXPECT_NEAR(linear_cross_entropy(h0, w0, targets, {}, 0, 1e7).item<double>(),
              reference(h0, w0, targets).loss.item<double>(), 1e-10);
}

// Where the weight's .grad is there (a training run's flat buffer), the head's gradient is
// scaled and summed into it in one pass; where it is not, autograd makes it. Both, over
// two backward passes of upstream gradient 3, in two chunkings.
TEST(LinearCrossEntropy, ASecondBackwardSumsTheHeadsGradientIntoItsGrad) {
  torch::manual_seed(8);
  const auto h0 = torch::randn({29, 12}, torch::kFloat64), w0 = torch::randn({41, 12}, torch::kFloat64);
  const auto targets = torch::randint(0, 41, {29}, torch::kInt64);
  const auto ref = reference(h0, w0, targets);
  for (const int64_t chunk : {int64_t{0}, int64_t{4}}) {
    auto h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    (linear_cross_entropy(h, w, targets, {}, chunk) * 3.0).backward();  // .grad made by autograd
    const auto first = w.grad().clone();
    const void* storage = w.grad().data_ptr();
    (linear_cross_entropy(h, w, targets, {}, chunk) * 3.0).backward();  // summed into it
    EXPECT_EQ(w.grad().data_ptr(), storage) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(first, ref.grad_w, 1e-10, 1e-12)) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(w.grad(), ref.grad_w * 2, 1e-10, 1e-12)) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(h.grad(), ref.grad_h * 2, 1e-10, 1e-12)) << "chunk " << chunk;
  }
}

TEST(LinearCrossEntropy, Float32MatchesWithinRounding) {
  torch::manual_seed(5);
  const auto h = torch::randn({64, 32}) * 4, w = torch::randn({1000, 32});
  const auto targets = torch::randint(0, 1000, {64}, torch::kInt64);
  // Logits of about |h||w| = 4 * 32 = 128 hold fp32's relative 6e-8: the loss's absolute
  // error is a few times 128 * 6e-8 = 8e-6.
  for (const int64_t chunk : {int64_t{0}, int64_t{7}}) {
    EXPECT_NEAR(linear_cross_entropy(h, w, targets, {}, chunk).item<double>(),
                torch::cross_entropy_loss(torch::mm(h, w.t()), targets).item<double>(), 1e-4);
  }
}

TEST(LinearCrossEntropy, OnlyTheWantedGradientsAreMadeAndFrozenWeightsGetNone) {
  torch::manual_seed(6);
  const auto h0 = torch::randn({20, 8}, torch::kFloat64), w0 = torch::randn({30, 8}, torch::kFloat64);
  const auto targets = torch::randint(0, 30, {20}, torch::kInt64);
  const auto ref = reference(h0, w0, targets);
  auto h = h0.clone().requires_grad_();
  (linear_cross_entropy(h, w0, targets, {}, 6) * 3.0).backward();
  EXPECT_TRUE(torch::allclose(h.grad(), ref.grad_h, 1e-10, 1e-12));
  torch::NoGradGuard no_grad;
  auto w = w0.clone().requires_grad_();
  const auto loss = linear_cross_entropy(h0, w, targets);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-12);
}

TEST(LinearCrossEntropy, Bfloat16GradientsAreTheFp64OnesWithinBf16Rounding) {
  torch::manual_seed(7);
  const int64_t n = 96, d = 32, v = 200;
  const auto hb = (torch::randn({n, d}) * 0.25).to(torch::kBFloat16);
  const auto wb = (torch::randn({v, d}) * 0.25).to(torch::kBFloat16);
  const auto targets = torch::randint(0, v, {n}, torch::kInt64);
  // The reference is fp64 from the same bf16 inputs, so what differs is bf16's rounding
  // (unit roundoff u = 2^-8): the logits' (each moved by at most u * max|logit|, which
  // moves the loss by at most twice that and every softmax probability p by a factor
  // within 1 +- 2 u max|logit|), then the softmax gradient's, each chunk's product's and
  // the scaled gradient's (u each).
  const auto h64 = hb.to(torch::kFloat64), w64 = wb.to(torch::kFloat64);
  const auto logits = torch::mm(h64, w64.t());
  const double u = 1.0 / 256, max_logit = logits.abs().max().item<double>();
  const auto ref = reference(hb, wb, targets);
  auto h = hb.clone().requires_grad_(), w = wb.clone().requires_grad_();
  const auto loss = linear_cross_entropy(h, w, targets, {}, 12);  // 8 chunks
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);                 // an fp32 loss whatever the compute dtype
  (loss * 3.0).backward();
  EXPECT_EQ(w.grad().scalar_type(), torch::kBFloat16);
  EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 2 * u * max_logit);
  // An element of a gradient sums terms (p + one-hot) * |w or h| * 3 / n; its error is at
  // most rel times their magnitudes' sum.
  const double rel = 2 * u * max_logit + 3 * u;
  const auto terms = torch::softmax(logits, 1) + torch::one_hot(targets, v).to(torch::kFloat64);
  const auto bound_h = terms.mm(w64.abs()) * (3.0 / n) * rel;
  const auto bound_w = terms.t().mm(h64.abs()) * (3.0 / n) * rel;
  EXPECT_TRUE((h.grad().to(torch::kFloat64) - ref.grad_h).abs().le(bound_h).all().item<bool>());
  EXPECT_TRUE((w.grad().to(torch::kFloat64) - ref.grad_w).abs().le(bound_w).all().item<bool>());
}

TEST(LinearCrossEntropy, NeverHoldsTheLogitsOfEveryRow) {
  count_host_tensor_memory();
  torch::manual_seed(8);
  const int64_t n = 512, d = 16, v = 4096;
  auto h = torch::randn({n, d}).requires_grad_(), w = torch::randn({v, d}).requires_grad_();
  const auto targets = torch::randint(0, v, {n}, torch::kInt64);
  const int64_t logits_bytes = n * v * 4;  // 8 MiB
  const int64_t chunk = 32;                // 512 KiB of logits a chunk
  const int64_t before = host_tensor_bytes();
  reset_peak_host_tensor_bytes();
  const auto loss = linear_cross_entropy(h, w, targets, {}, chunk);
  loss.backward();
  const int64_t peak = peak_host_tensor_bytes() - before;
  // What may be live at once: a chunk's logits and its gradient copy, the gradients of h
  // and w (saved, then scaled), and small row vectors.
  const int64_t allowed = 2 * chunk * v * 4 + 2 * (n * d + v * d) * 4 + int64_t{64} * 1024;
  EXPECT_LT(peak, allowed);
  EXPECT_LT(peak, logits_bytes / 4);
  EXPECT_TRUE(torch::allclose(loss, torch::cross_entropy_loss(torch::mm(h, w.t()), targets), 1e-5, 1e-5));
}

TEST(LinearCrossEntropy, ChunkRowsKeepAChunksLogitsWithinTheBudget) {
  // fp32 logits: the 512 MiB budget binds before the 8192-row target.
  EXPECT_EQ(cross_entropy_chunk_rows(16384, 32000), 4160);  // 2^29 / 128000 = 4194, to a multiple of 64
  EXPECT_LE(cross_entropy_chunk_rows(16384, 32000) * 32000 * 4, int64_t{512} << 20);
  EXPECT_EQ(cross_entropy_chunk_rows(100, 32000), 100);      // fewer rows than a chunk: one chunk
  EXPECT_EQ(cross_entropy_chunk_rows(1 << 20, 1 << 28), 1);  // a vocabulary past the budget: a row a chunk
  EXPECT_EQ(cross_entropy_chunk_rows(0, 50), 1);
  // bf16 logits turned into their gradient in place (CUDA): the 8192-row target, within the
  // budget (2^28 / 32000 = 8388 would fit), so S1's 16384 rows take two chunks.
  EXPECT_EQ(cross_entropy_chunk_rows(16384, 32000, 2), 8192);
  EXPECT_LE(cross_entropy_chunk_rows(16384, 32000, 2) * 32000 * 2, int64_t{512} << 20);
  // A small vocabulary: the target, not the budget.
  EXPECT_EQ(cross_entropy_chunk_rows(1 << 20, 8192), 8192);
  // A large one (BLOOM's 250880, bf16): the budget again, 2^28 / 250880 = 1070.
  EXPECT_EQ(cross_entropy_chunk_rows(16384, 250880, 2), 1024);
}

}  // namespace
}  // namespace tide
