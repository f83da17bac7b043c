// The dp x cp x tp x pp layout of a world of ranks. Passed explicitly (no process-wide
// state), so two engines can live in one process.
//
// Rank order puts tensor-parallel neighbours next to each other (they talk the most and
// belong on one node), then context-parallel ones (a collective a layer), then
// data-parallel, then pipeline stages (Megatron-Core's order):
//   rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
#pragma once

#include <string>
#include <vector>

namespace tide {

struct GridCoords {
  int dp = 0, tp = 0, pp = 0, cp = 0;
};

class Grid {
 public:
  // dp = 0 infers it as world / (cp * tp * pp). Throws ConfigError naming every factor
  // when dp * cp * tp * pp != world.
  Grid(int world, int rank, int dp, int tp, int pp, int cp = 1);

  int world() const { return world_; }
  int rank() const { return rank_; }
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int cp() const { return cp_; }
  GridCoords coords() const { return coords_of(rank_); }
  GridCoords coords_of(int rank) const;
  int rank_of(const GridCoords& c) const;

  // Global ranks of this rank's groups, in group-rank order.
  std::vector<int> dp_group() const;
  std::vector<int> tp_group() const;
  std::vector<int> pp_group() const;
  std::vector<int> cp_group() const;
  // The ranks that hold the same parameters (the same tensor-parallel slice and pipeline
  // stage): the dp x cp ranks, which reduce their gradients together (Megatron-Core's
  // data-parallel group with context parallelism), cp-fastest.
  std::vector<int> replica_group() const;
  // Expert parallelism (parallel.ep) inside the dp axis, ep dividing dp: the ep
  // consecutive dp ranks over which this rank's block experts are spread (dp rank d is
  // expert-parallel rank d % ep), and the dp / ep ranks that hold the same experts as
  // this one, which reduce their gradients together.
  std::vector<int> ep_group(int ep) const;
  std::vector<int> expert_replica_group(int ep) const;
  // A stable name for the group, used as its store prefix ("dp.tp0.cp0.pp1").
  std::string dp_group_name() const;
  std::string tp_group_name() const;
  std::string pp_group_name() const;
  std::string cp_group_name() const;
  std::string replica_group_name() const;
  std::string ep_group_name(int ep) const;
  std::string expert_replica_group_name(int ep) const;

  std::string describe() const;  // "dp2 x tp1 x pp1 (rank 1 = dp1 tp0 pp0)", cp where above 1

 private:
  // The ranks whose coordinates are this rank's but for `axis`, which runs [0, size).
  std::vector<int> group_along(int GridCoords::*axis, int size) const;

  int world_, rank_, dp_, tp_, pp_, cp_;
};

}  // namespace tide
