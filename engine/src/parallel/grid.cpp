#include "tide/engine/parallel/grid.h"

#include <fmt/format.h>

#include "tide/engine/config_schema.h"

namespace tide {

Grid::Grid(int world, int rank, int dp, int tp, int pp, int cp)
    : world_(world), rank_(rank), dp_(dp), tp_(tp), pp_(pp), cp_(cp) {
  if (world < 1) throw ConfigError("world", fmt::format("the world size must be at least 1, got {}", world));
  if (rank < 0 || rank >= world) throw ConfigError("rank", fmt::format("rank {} is outside [0, {})", rank, world));
  if (tp < 1 || pp < 1 || cp < 1)
    throw ConfigError("parallel", fmt::format("tp = {}, pp = {} and cp = {} must each be at least 1", tp, pp, cp));
  // The product of the model-parallel factors, spelt as the recipe would (cp only where set).
  const std::string factors =
      cp > 1 ? fmt::format("cp = {} x tp = {} x pp = {}", cp, tp, pp) : fmt::format("tp = {} x pp = {}", tp, pp);
  if (dp_ == 0) {
    if (world % (cp * tp * pp) != 0)
      throw ConfigError("parallel", fmt::format("the world of {} ranks does not divide into {} (dp would be {}/{})",
                                                world, factors, world, cp * tp * pp));
    dp_ = world / (cp * tp * pp);
  }
  if (dp_ * cp * tp * pp != world) {
    const std::string product = cp > 1 ? fmt::format("dp x cp x tp x pp = {} x {} x {} x {}", dp_, cp, tp, pp)
                                       : fmt::format("dp x tp x pp = {} x {} x {}", dp_, tp, pp);
    throw ConfigError("parallel",
                      fmt::format("{} = {} ranks, but the world has {}", product, dp_ * cp * tp * pp, world));
  }
}

GridCoords Grid::coords_of(int rank) const {
  GridCoords c;
  c.tp = rank % tp_;
  c.cp = (rank / tp_) % cp_;
  c.dp = (rank / (tp_ * cp_)) % dp_;
  c.pp = rank / (tp_ * cp_ * dp_);
  return c;
}

int Grid::rank_of(const GridCoords& c) const { return ((c.pp * dp_ + c.dp) * cp_ + c.cp) * tp_ + c.tp; }

std::vector<int> Grid::group_along(int GridCoords::*axis, int size) const {
  std::vector<int> out;
  GridCoords c = coords();
  for (c.*axis = 0; c.*axis < size; ++(c.*axis)) out.push_back(rank_of(c));
  return out;
}

std::vector<int> Grid::dp_group() const { return group_along(&GridCoords::dp, dp_); }
std::vector<int> Grid::tp_group() const { return group_along(&GridCoords::tp, tp_); }
std::vector<int> Grid::pp_group() const { return group_along(&GridCoords::pp, pp_); }
std::vector<int> Grid::cp_group() const { return group_along(&GridCoords::cp, cp_); }

std::vector<int> Grid::replica_group() const {
  std::vector<int> out;
  GridCoords c = coords();
  for (c.dp = 0; c.dp < dp_; ++c.dp)
    for (c.cp = 0; c.cp < cp_; ++c.cp) out.push_back(rank_of(c));
  return out;
}

std::vector<int> Grid::ep_group(int ep) const {
  std::vector<int> out;
  GridCoords c = coords();
  const int first = c.dp / ep * ep;
  for (c.dp = first; c.dp < first + ep; ++c.dp) out.push_back(rank_of(c));
  return out;
}

std::vector<int> Grid::expert_replica_group(int ep) const {
  std::vector<int> out;
  GridCoords c = coords();
  for (c.dp = c.dp % ep; c.dp < dp_; c.dp += ep) out.push_back(rank_of(c));
  return out;
}

std::string Grid::dp_group_name() const {
  return fmt::format("dp.tp{}.cp{}.pp{}", coords().tp, coords().cp, coords().pp);
}
std::string Grid::tp_group_name() const {
  return fmt::format("tp.dp{}.cp{}.pp{}", coords().dp, coords().cp, coords().pp);
}
std::string Grid::pp_group_name() const {
  return fmt::format("pp.dp{}.cp{}.tp{}", coords().dp, coords().cp, coords().tp);
}
std::string Grid::cp_group_name() const {
  return fmt::format("cp.dp{}.tp{}.pp{}", coords().dp, coords().tp, coords().pp);
}
std::string Grid::ep_group_name(int ep) const {
  return fmt::format("ep{}.tp{}.cp{}.pp{}", coords().dp / ep, coords().tp, coords().cp, coords().pp);
}
std::string Grid::expert_replica_group_name(int ep) const {
  return fmt::format("edp{}.tp{}.cp{}.pp{}", coords().dp % ep, coords().tp, coords().cp, coords().pp);
}
std::string Grid::replica_group_name() const { return fmt::format("dpcp.tp{}.pp{}", coords().tp, coords().pp); }

std::string Grid::describe() const {
  const auto c = coords();
  if (cp_ == 1)
    return fmt::format("dp{} x tp{} x pp{} (rank {} = dp{} tp{} pp{})", dp_, tp_, pp_, rank_, c.dp, c.tp, c.pp);
  return fmt::format("dp{} x cp{} x tp{} x pp{} (rank {} = dp{} cp{} tp{} pp{})", dp_, cp_, tp_, pp_, rank_, c.dp, c.cp,
                     c.tp, c.pp);
}

}  // namespace tide
