#include "launcher.h"

#include <thread>

#include <spdlog/spdlog.h>


namespace tide::cli {

int launch_workers(ipc::WorkerSpec spec) {
  if (spec.executable.empty()) spec.executable = "/proc/self/exe";
  spec.die_with_parent = true;  // a killed launcher takes its workers with it
  ipc::WorkerGroup group(spec);
  const int world = spec.nproc * spec.nnodes;
  spdlog::info("started {} workers (ranks {}..{} of {}), rendezvous at {}", spec.nproc, spec.node_rank * spec.nproc,
               spec.node_rank * spec.nproc + spec.nproc - 1, world, group.master());

  while (!group.all_ended()) {
    for (const auto& exit : group.reap()) {
      if (exit.ok()) continue;
      spdlog::error("rank {} (pid {}) {}; stopping the other {} workers", exit.rank, exit.pid, exit.describe(),
                    group.live_count());
      // Workers blocked in a collective may not react to SIGTERM at once: give them a
      // moment, then kill them.
      group.end(std::chrono::seconds(10));
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

}  // namespace tide::cli
