#include "launcher.h"

#include <signal.h>
#include <sys/wait.h>

#include <thread>

#include <spdlog/spdlog.h>

#include "tide/engine/parallel/distributed.h"
#include "tide/worker/stop_signals.h"

namespace tide::worker {

int launch_workers(ipc::WorkerSpec spec) {
  spec.die_with_parent = true;  // a killed launcher takes its workers with it
  ipc::WorkerGroup group(spec);
  const int world = spec.nproc * spec.nnodes;
  spdlog::info("started {} workers (ranks {}..{} of {}), rendezvous at {}", spec.nproc, spec.node_rank * spec.nproc,
               spec.node_rank * spec.nproc + spec.nproc - 1, world, group.master());

  // The workers run in their own process group (WorkerGroup), so a terminal's Ctrl-C
  // reaches only this process: it passes one SIGTERM on, and rank 0 stops the run at its
  // next step boundary after a checkpoint. A second signal ends this process, and its
  // workers with it (die_with_parent).
  install_stop_signals();
  bool forwarded = false;
  while (!group.all_ended()) {
    if (stop_signal() != 0 && !forwarded) {
      spdlog::info("signal {}: asking the {} workers to stop after a checkpoint", stop_signal(), group.live_count());
      group.terminate(std::chrono::hours(24));  // no deadline of ours: a second signal is the user's
      forwarded = true;
    }
    for (const auto& exit : group.reap()) {
      // A worker that stopped on the forwarded SIGTERM exits 128 + SIGTERM, its work saved.
      const bool stopped = forwarded && WIFEXITED(exit.status) && WEXITSTATUS(exit.status) == 128 + SIGTERM;
      if (exit.ok() || stopped) continue;
      const bool peer_lost = WIFEXITED(exit.status) && WEXITSTATUS(exit.status) == kPeerLostExitStatus;
      spdlog::error("rank {} (pid {}) {}{}; stopping the other {} workers", exit.rank, exit.pid, exit.describe(),
                    peer_lost ? " (it lost a peer host: its line above names it)" : "", group.live_count());
      // Workers blocked in a collective may not react to SIGTERM at once: give them a
      // moment, then kill them.
      group.end(std::chrono::seconds(10));
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

}  // namespace tide::worker
