#include <fmt/format.h>

#include "run_executor.h"

namespace tide::ipc {

LocalWorkers::LocalWorkers(const WorkerSpec& spec) : group_(spec) {}

std::vector<std::string> LocalWorkers::reap() {
  std::vector<std::string> faults;
  for (const auto& exit : group_.reap())
    if (!exit.ok()) faults.push_back(fmt::format("rank {} (pid {}) {}", exit.rank, exit.pid, exit.describe()));
  return faults;
}

std::map<int, RunExecutor::LiveRank> LocalWorkers::live() const {
  std::map<int, LiveRank> out;
  for (const auto& [pid, rank] : group_.live()) out[rank] = {fmt::format("pid {}", pid), started_};
  return out;
}

void LocalWorkers::describe(nlohmann::json& status) const {
  nlohmann::json pids = nlohmann::json::object();
  for (const auto& [pid, rank] : group_.live()) pids[std::to_string(rank)] = pid;
  status["pids"] = pids;
}

}  // namespace tide::ipc
