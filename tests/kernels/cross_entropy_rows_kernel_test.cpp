// The loss's rows kernel (engine/src/kernels/cross_entropy_rows.cu) on the emulated GPU
// against the exact log-sum-exp and softmax in double: 16-byte packs and element at a
// time, -inf logits (masked), the gradient written over the logits, targets outside the
// vocabulary (a NaN loss, no read outside the row) and uncounted rows (loss 0, zeros).
#include <algorithm>
#include <limits>

#include "kernel_test_support.h"

namespace tide::kernels {
namespace {

struct Case {
  int64_t rows, vocab;
  bool gradient;
  int offset;  // logits start this many elements past an aligned address
};

template <typename T>
void check_rows(const Case& c) {
  SCOPED_TRACE(std::string(element_name<T>()) + " " + std::to_string(c.rows) + "x" + std::to_string(c.vocab) +
               (c.gradient ? " gradient" : "") + (c.offset ? " unaligned" : ""));
  const auto n = static_cast<std::size_t>(c.rows * c.vocab);
  auto buf = random_values<T>(n + c.offset, 9, 3.0);
  T* logits = buf.data() + c.offset;
  // Masked logits: every 7th of row 0 from its first (before any finite one), and all of
  // row 1 but three.
  const T minus_inf = from_host_float<T>(-std::numeric_limits<float>::infinity());
  for (int64_t k = 0; k < c.vocab; k += 7) logits[k] = minus_inf;
  if (c.rows > 1)
    for (int64_t k = 3; k < c.vocab; ++k) logits[c.vocab + k] = minus_inf;
  std::vector<int64_t> targets(static_cast<std::size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) targets[r] = (r * 389 + 1) % c.vocab;
  if (c.rows > 1) targets[1] = 2;  // a finite logit of the masked row
  const auto before = as_double(logits, n);
  std::vector<float> loss(static_cast<std::size_t>(c.rows));

  cross_entropy_rows(logits, targets.data(), loss.data(), c.rows, c.vocab, c.gradient, element_of<T>(), nullptr);

  const double u = kUnitFp32;
  std::vector<double> loss_want(c.rows), loss_bound(c.rows), grad_want(n), grad_bound(n);
  for (int64_t r = 0; r < c.rows; ++r) {
    const double* l = before.data() + r * c.vocab;
    double m = -INFINITY, lo = INFINITY;
    for (int64_t k = 0; k < c.vocab; ++k)
      if (l[k] != -INFINITY) {
        m = std::max(m, l[k]);
        lo = std::min(lo, l[k]);
      }
    double sum = 0;
    for (int64_t k = 0; k < c.vocab; ++k) sum += std::exp(l[k] - m);
    // The sum's relative error: each term's exponent l - m rounded (|l - m| u, at most
    // the row's range), its exponential and its add (2u), rescales by later maxima (their
    // exponents add up to at most the range: range u, and one rounding each: vocab u),
    // the block's merge of 512 threads (9 levels, 3 roundings each).
    const double range = m - lo;
    const double sum_rel = (2 * range + 3 * static_cast<double>(c.vocab) + 30) * u;
    const double target = l[targets[r]];
    loss_want[r] = std::log(sum) + m - target;
    loss_bound[r] = sum_rel + 4 * u * (std::abs(std::log(sum)) + std::abs(m) + std::abs(target));
    for (int64_t k = 0; k < c.vocab; ++k) {
      const double p = std::exp(l[k] - m) / sum, g = k == targets[r] ? p - 1 : p;
      grad_want[r * c.vocab + k] = g;
      // p: its exponent, exponential, the reciprocal of the sum and the product (range u
      // and 3u beside the sum's error), then p - 1 for the target, then T's rounding.
      grad_bound[r * c.vocab + k] = (sum_rel + (range + 4) * u) * p + u * std::abs(g) + storage_error<T>(g);
    }
  }
  expect_within(as_double(loss), loss_want, loss_bound, "loss");
  if (c.gradient) {
    expect_within(as_double(logits, n), grad_want, grad_bound, "gradient");
  } else {
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(to_host_float(logits[i]), before[i]) << "logit " << i << " written";
  }
}

TEST(EmulatedKernels, CrossEntropyRowsInPacksAndElements) {
  check_rows<__nv_bfloat16>({5, 4096, true, 0});  // whole packs of 8, several a thread
  check_rows<__nv_bfloat16>({4, 1000, false, 0});
  check_rows<float>({3, 1003, true, 0});  // not whole packs
  check_rows<float>({3, 1000, true, 1});  // unaligned logits
  check_rows<__half>({2, 512, true, 0});
  check_rows<float>({2, 3, true, 0});  // fewer logits than threads: most hold none
}

TEST(EmulatedKernels, CrossEntropyRowsGiveNaNForATargetOutsideTheVocabulary) {
  for (const int64_t target : {int64_t{-1}, int64_t{1000}, int64_t{1} << 40}) {
    auto logits = random_values<__nv_bfloat16>(2000, 10);
    const std::vector<int64_t> targets{target, 7};
    std::vector<float> loss(2);
    cross_entropy_rows(logits.data(), targets.data(), loss.data(), 2, 1000, true, Element::BF16, nullptr);
    EXPECT_TRUE(std::isnan(loss[0])) << "target " << target << ": loss " << loss[0];
    EXPECT_TRUE(std::isfinite(loss[1])) << "the next row's loss " << loss[1];
  }
}

// A row whose target is kUncountedTarget (data.eod_mask_loss) counts for nothing: loss 0
// and, with the gradient, zeros over its logits; the rows beside it get the bits they get
// when every row counts (a block a row: nothing is shared between rows).
template <typename T>
void check_uncounted(int64_t vocab) {
  SCOPED_TRACE(std::string(element_name<T>()) + " vocabulary " + std::to_string(vocab));
  const auto n = static_cast<std::size_t>(3 * vocab);
  const auto original = random_values<T>(n, 12, 3.0);
  for (const bool gradient : {false, true}) {
    auto all = original, some = original;
    const std::vector<int64_t> counted{5 % vocab, 9 % vocab, 1 % vocab},
        uncounted{5 % vocab, kUncountedTarget, 1 % vocab};
    std::vector<float> loss_all(3), loss_some(3);
    cross_entropy_rows(all.data(), counted.data(), loss_all.data(), 3, vocab, gradient, element_of<T>(), nullptr);
    cross_entropy_rows(some.data(), uncounted.data(), loss_some.data(), 3, vocab, gradient, element_of<T>(), nullptr);
    EXPECT_EQ(loss_some[1], 0.0f);
    EXPECT_GT(loss_all[1], 0.0f);
    EXPECT_EQ(loss_some[0], loss_all[0]);
    EXPECT_EQ(loss_some[2], loss_all[2]);
    for (int64_t k = 0; k < vocab; ++k) {
      const auto i = static_cast<std::size_t>(k);
      ASSERT_EQ(to_host_float(some[i]), to_host_float(all[i])) << "row 0, logit " << k;
      ASSERT_EQ(to_host_float(some[2 * vocab + i]), to_host_float(all[2 * vocab + i])) << "row 2, logit " << k;
      ASSERT_EQ(to_host_float(some[vocab + i]), gradient ? 0.0f : to_host_float(original[vocab + i]))
          << "row 1, logit " << k;
    }
  }
}

TEST(EmulatedKernels, CrossEntropyRowsCountNothingOfAnUncountedRow) {
  check_uncounted<__nv_bfloat16>(4096);  // packs
  check_uncounted<float>(1003);          // elements
  check_uncounted<__half>(3);            // fewer logits than threads
}

}  // namespace
}  // namespace tide::kernels
