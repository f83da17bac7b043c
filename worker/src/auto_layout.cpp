#include "auto_layout.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/plan/plan.h"
#include "tide/engine/train/local_device.h"

namespace tide::worker {

namespace {
DeviceSpec planning_device(const RunConfig& cfg, int ranks_per_node, bool independent) {
  if (cfg.device == "cuda") return local_cuda_device();
  const std::string path = default_calibration_path();
  if (independent) {
    std::optional<DeviceSpec> stored;
    try {
      stored = stored_cpu_device(path, ranks_per_node);
    } catch (const std::exception& e) {
      throw ConfigError("parallel.auto", fmt::format("the calibration {} is unreadable: {}", path, e.what()));
    }
    if (!stored)
      throw ConfigError("parallel.auto",
                        fmt::format("ranks that start on their own decide the layout each; they must read the same "
                                    "figures: run `tide plan --calibrate` on this machine first ({} has none for "
                                    "{} rank(s) per node)",
                                    path, ranks_per_node));
    return *stored;
  }
  return local_cpu_device(path, ranks_per_node);
}
}  // namespace

std::vector<std::string> auto_layout_overrides(const RunConfig& cfg, int nodes, int ranks_per_node, bool independent) {
  Cluster cluster;
  cluster.nodes = nodes;
  cluster.devices_per_node = ranks_per_node;
  cluster.device = planning_device(cfg, ranks_per_node, independent);
  const LayoutChoice choice = choose_layout(cfg, cluster);
  spdlog::info("{}", choice.explanation);
  return choice.overrides;
}

}  // namespace tide::worker
