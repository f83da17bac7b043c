#include <algorithm>

#include <gtest/gtest.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/parallel/pipeline.h"
#include "tiny_models.h"

namespace tide {
namespace {

TEST(PipelineSchedule, OneForwardOneBackwardBoundsActivationsAndKeepsOrder) {
  const int stages = 4;
  const int64_t m = 8;
  for (int s = 0; s < stages; ++s) {
    const auto ops = pipeline_schedule("1f1b", s, stages, m);
    ASSERT_EQ(ops.size(), static_cast<size_t>(2 * m));
    int64_t alive = 0, most = 0, next_forward = 1, next_backward = 1;
    for (const auto op : ops) {
      if (op > 0) {
        EXPECT_EQ(op, next_forward++);  // forwards in order
        most = std::max(most, ++alive);
      } else {
        EXPECT_EQ(-op, next_backward++);  // backwards in order, each after its forward
        EXPECT_LT(-op, next_forward);
        --alive;
      }
    }
    EXPECT_EQ(most, std::min<int64_t>(stages - s, m)) << "stage " << s;
  }
  // GPipe: every forward first.
  const auto gpipe = pipeline_schedule("gpipe", 1, stages, m);
  EXPECT_TRUE(std::all_of(gpipe.begin(), gpipe.begin() + m, [](int64_t op) { return op > 0; }));
  EXPECT_THROW(pipeline_schedule("zigzag", 0, 2, 2), std::exception);
}

TEST(PartitionStages, BalancesCostAndHonoursAGivenCut) {
  ModelConfig m = testing::tiny_llama();
  m.n_layers = 8;
  auto stages = partition_stages(m, 2, 64);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].first_block, 0);
  EXPECT_EQ(stages[0].end_block, stages[1].first_block);
  EXPECT_EQ(stages[1].end_block, 8);
  EXPECT_TRUE(stages[0].first && !stages[0].last && stages[1].last && !stages[1].first);
  // A large vocabulary makes the output head expensive: the last stage gets fewer blocks.
  ModelConfig big_head = m;
  big_head.vocab_size = 200000;
  const auto skewed = partition_stages(big_head, 2, 64);
  EXPECT_GT(skewed[0].end_block - skewed[0].first_block, skewed[1].end_block - skewed[1].first_block);
  const auto given = partition_stages(m, 3, 64, {2, 5, 1});
  EXPECT_EQ(given[1].first_block, 2);
  EXPECT_EQ(given[1].end_block, 7);
  EXPECT_THROW(partition_stages(m, 3, 64, {2, 2, 2}), ConfigError);
  EXPECT_THROW(partition_stages(m, 9, 64), ConfigError);
}

}  // namespace
}  // namespace tide
