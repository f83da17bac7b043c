#include "tide/engine/parallel/grid.h"

#include <fmt/format.h>

#include "tide/engine/config_schema.h"

namespace tide {

Grid::Grid(int world, int rank, int dp, int tp, int pp) : world_(world), rank_(rank), dp_(dp), tp_(tp), pp_(pp) {
  if (world < 1) throw ConfigError("world", fmt::format("the world size must be at least 1, got {}", world));
  if (rank < 0 || rank >= world) throw ConfigError("rank", fmt::format("rank {} is outside [0, {})", rank, world));
  if (tp < 1 || pp < 1)
    throw ConfigError("parallel", fmt::format("tp = {} and pp = {} must both be at least 1", tp, pp));
  if (dp_ == 0) {
    if (world % (tp * pp) != 0)
      throw ConfigError("parallel", fmt::format("the world of {} ranks does not divide into tp = {} x pp = {} "
                                                "(dp would be {}/{})",
                                                world, tp, pp, world, tp * pp));
    dp_ = world / (tp * pp);
  }
  if (dp_ * tp * pp != world)
    throw ConfigError("parallel", fmt::format("dp x tp x pp = {} x {} x {} = {} ranks, but the world has {}", dp_, tp,
                                              pp, dp_ * tp * pp, world));
}

GridCoords Grid::coords_of(int rank) const {
  GridCoords c;
  c.tp = rank % tp_;
  c.dp = (rank / tp_) % dp_;
  c.pp = rank / (tp_ * dp_);
  return c;
}

int Grid::rank_of(const GridCoords& c) const { return (c.pp * dp_ + c.dp) * tp_ + c.tp; }

std::vector<int> Grid::dp_group() const {
  std::vector<int> out;
  GridCoords c = coords();
  for (c.dp = 0; c.dp < dp_; ++c.dp) out.push_back(rank_of(c));
  return out;
}

std::vector<int> Grid::tp_group() const {
  std::vector<int> out;
  GridCoords c = coords();
  for (c.tp = 0; c.tp < tp_; ++c.tp) out.push_back(rank_of(c));
  return out;
}

std::vector<int> Grid::pp_group() const {
  std::vector<int> out;
  GridCoords c = coords();
  for (c.pp = 0; c.pp < pp_; ++c.pp) out.push_back(rank_of(c));
  return out;
}

std::string Grid::dp_group_name() const { return fmt::format("dp.tp{}.pp{}", coords().tp, coords().pp); }
std::string Grid::tp_group_name() const { return fmt::format("tp.dp{}.pp{}", coords().dp, coords().pp); }
std::string Grid::pp_group_name() const { return fmt::format("pp.dp{}.tp{}", coords().dp, coords().tp); }

std::string Grid::describe() const {
  const auto c = coords();
  return fmt::format("dp{} x tp{} x pp{} (rank {} = dp{} tp{} pp{})", dp_, tp_, pp_, rank_, c.dp, c.tp, c.pp);
}

}  // namespace tide
