#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tide/engine/model/linear_cross_entropy.h"

namespace tide {
namespace {

TEST(LinearCrossEntropy, EqualsProjectionThenCrossEntropy) {
  torch::manual_seed(4);
  const auto h0 = torch::randn({37, 16}, torch::kFloat64), w0 = torch::randn({53, 16}, torch::kFloat64);
  const auto targets = torch::randint(0, 53, {37}, torch::kInt64);
  auto h1 = h0.clone().requires_grad_(), w1 = w0.clone().requires_grad_();
  auto h2 = h0.clone().requires_grad_(), w2 = w0.clone().requires_grad_();
  const auto fused = linear_cross_entropy(h1, w1, targets);
  const auto reference = torch::cross_entropy_loss(torch::mm(h2, w2.t()), targets);
  EXPECT_NEAR(fused.item<double>(), reference.item<double>(), 1e-12);
  (fused * 3.0).backward();  // an upstream gradient other than one
  (reference * 3.0).backward();
  EXPECT_TRUE(torch::allclose(h1.grad(), h2.grad(), 1e-10, 1e-12));
  EXPECT_TRUE(torch::allclose(w1.grad(), w2.grad(), 1e-10, 1e-12));
}

TEST(LinearCrossEntropy, Float32MatchesWithinRounding) {
  torch::manual_seed(5);
  const auto h = torch::randn({64, 32}) * 4, w = torch::randn({1000, 32});
  const auto targets = torch::randint(0, 1000, {64}, torch::kInt64);
  EXPECT_NEAR(linear_cross_entropy(h, w, targets).item<double>(),
              torch::cross_entropy_loss(torch::mm(h, w.t()), targets).item<double>(), 1e-4);
}

}  // namespace
}  // namespace tide
