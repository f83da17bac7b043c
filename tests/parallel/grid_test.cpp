#include <gtest/gtest.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/parallel/grid.h"

namespace tide {
namespace {

TEST(Grid, InfersDpAndNamesEveryFactorWhenWrong) {
  EXPECT_EQ(Grid(8, 0, 0, 2, 2).dp(), 2);
  try {
    Grid(6, 0, 2, 2, 2);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp x tp x pp = 2 x 2 x 2 = 8 ranks, but the world has 6"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Grid(6, 0, 0, 4, 1), ConfigError);
  EXPECT_THROW(Grid(4, 4, 0, 1, 1), ConfigError);
}

TEST(Grid, TensorParallelNeighboursAreAdjacent) {
  // dp2 x tp2 x pp2 = 8: rank = (pp * dp + dp_rank) * tp + tp_rank.
  for (int r = 0; r < 8; ++r) {
    const Grid g(8, r, 2, 2, 2);
    EXPECT_EQ(g.rank_of(g.coords()), r);
  }
  const Grid g(8, 5, 2, 2, 2);  // pp1 dp0 tp1
  EXPECT_EQ(g.coords().pp, 1);
  EXPECT_EQ(g.coords().dp, 0);
  EXPECT_EQ(g.coords().tp, 1);
  EXPECT_EQ(g.tp_group(), (std::vector<int>{4, 5}));
  EXPECT_EQ(g.dp_group(), (std::vector<int>{5, 7}));
  EXPECT_EQ(g.pp_group(), (std::vector<int>{1, 5}));
  EXPECT_EQ(g.dp_group_name(), "dp.tp1.cp0.pp1");
  EXPECT_EQ(g.replica_group(), g.dp_group());  // without context parallelism the replicas are the dp ranks
}

TEST(Grid, ContextParallelRanksSitBetweenTensorAndDataParallelOnes) {
  // dp2 x cp2 x tp2 x pp2 = 16: rank = ((pp * dp + dp_rank) * cp + cp_rank) * tp + tp_rank.
  for (int r = 0; r < 16; ++r) {
    const Grid g(16, r, 0, 2, 2, 2);
    EXPECT_EQ(g.dp(), 2);
    EXPECT_EQ(g.rank_of(g.coords()), r);
  }
  const Grid g(16, 11, 2, 2, 2, 2);  // pp1 dp0 cp1 tp1
  EXPECT_EQ(g.coords().pp, 1);
  EXPECT_EQ(g.coords().dp, 0);
  EXPECT_EQ(g.coords().cp, 1);
  EXPECT_EQ(g.coords().tp, 1);
  EXPECT_EQ(g.tp_group(), (std::vector<int>{10, 11}));
  EXPECT_EQ(g.cp_group(), (std::vector<int>{9, 11}));
  EXPECT_EQ(g.dp_group(), (std::vector<int>{11, 15}));
  EXPECT_EQ(g.pp_group(), (std::vector<int>{3, 11}));
  EXPECT_EQ(g.replica_group(), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(g.describe(), "dp2 x cp2 x tp2 x pp2 (rank 11 = dp0 cp1 tp1 pp1)");
  try {
    Grid(8, 0, 2, 2, 1, 3);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp x cp x tp x pp = 2 x 3 x 2 x 1 = 12 ranks, but the world has 8"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Grid(8, 0, 0, 1, 1, 3), ConfigError);  // 8 ranks do not divide by cp = 3
}

TEST(Grid, ExpertParallelGroupsSplitTheDataParallelRanks) {
  // dp4 x tp2 = 8, ep2: dp ranks {0, 1} and {2, 3} spread the experts; {0, 2} and {1, 3}
  // hold the same ones.
  const Grid g(8, 5, 4, 2, 1);  // dp2 tp1
  EXPECT_EQ(g.coords().dp, 2);
  EXPECT_EQ(g.ep_group(2), (std::vector<int>{5, 7}));
  EXPECT_EQ(g.expert_replica_group(2), (std::vector<int>{1, 5}));
  EXPECT_EQ(g.ep_group(4), g.dp_group());
  EXPECT_EQ(g.expert_replica_group(4), (std::vector<int>{5}));
  EXPECT_EQ(g.ep_group_name(2), "ep1.tp1.cp0.pp0");
  EXPECT_EQ(g.expert_replica_group_name(2), "edp0.tp1.cp0.pp0");
  EXPECT_NE(Grid(8, 7, 4, 2, 1).ep_group_name(2), Grid(8, 3, 4, 2, 1).ep_group_name(2));
}

}  // namespace
}  // namespace tide
