#include <gtest/gtest.h>
#include <torch/types.h>

#include "test_data.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/data/token_dataset.h"

namespace tide {
namespace {

TEST(BatchLoader, TargetsAreTokensShiftedByOne) {
  const TokenDataset ds(testing::small_dataset());
  const auto& split = ds.split("train");
  const Batch b = make_batch(split, 5, 0, 4, 32);
  ASSERT_EQ(b.tokens.sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_TRUE(torch::equal(b.tokens.narrow(1, 1, 31), b.targets.narrow(1, 0, 31)));
  // Each row is a real window of the split.
  const int64_t start = window_start(5, 0, split.size(), 32);
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(b.tokens[0][i].item<int64_t>(), split.at(start + i));
}

TEST(BatchLoader, DeterministicAndResumableAtAnyCursor) {
  const TokenDataset ds(testing::small_dataset());
  const auto& split = ds.split("train");
  std::vector<Batch> straight;
  {
    BatchLoader l(split, 9, 4, 16, 0, 3);
    for (int i = 0; i < 6; ++i) straight.push_back(l.next());
    EXPECT_EQ(l.cursor(), 24);
  }
  BatchLoader resumed(split, 9, 4, 16, /*cursor=*/12, 0);  // after three batches, no prefetch
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(torch::equal(resumed.next().tokens, straight[i].tokens)) << i;
  BatchLoader other_seed(split, 10, 4, 16, 0, 2);
  EXPECT_FALSE(torch::equal(other_seed.next().tokens, straight[0].tokens));
}

TEST(BatchLoader, RefusesSplitsShorterThanAWindow) {
  const TokenDataset ds(testing::small_dataset());
  EXPECT_THROW(BatchLoader(ds.split("val"), 1, 1, ds.split("val").size(), 0, 0), std::runtime_error);
}

}  // namespace
}  // namespace tide
