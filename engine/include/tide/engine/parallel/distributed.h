// A rank's view of its job: the grid and a communicator for each of its groups.
#pragma once

#include <memory>

#include "tide/engine/config.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/grid.h"
#include "tide/engine/parallel/launch_env.h"

namespace tide {

struct Distributed {
  Grid grid;
  LaunchEnv env;  // where the rendezvous store is (StoreClient)
  std::unique_ptr<Comm> world, dp, tp, pp;
  // The first and the last pipeline stage of this rank's (dp, tp) pipeline, which both
  // hold tied embeddings; null on the stages in between.
  std::unique_ptr<Comm> embedding;
  struct Store;  // keeps the rendezvous store alive
  std::shared_ptr<Store> store;
  // Publishes this rank's collective progress every second, so that a rank whose
  // collective times out names the peers that are silent (stopped, dead) or elsewhere.
  struct Heartbeat;
  std::shared_ptr<Heartbeat> heartbeat;
};

// Rendezvous through a TCPStore hosted by rank 0 at MASTER_ADDR:MASTER_PORT, then one
// process group per grid axis, and the heartbeat. Gloo for CPU ranks; NCCL for CUDA ranks
// (`cuda`) unless parallel.backend is "gloo". Every collective and the rendezvous give up after
// `timeout`, with an error naming the group and the operation. Sets SIGPIPE to ignored
// for the process, as Gloo needs (a dead peer must fail a collective, not kill the rank).
std::unique_ptr<Distributed> init_distributed(const LaunchEnv& env, const ParallelConfig& parallel,
                                              std::chrono::milliseconds timeout, bool cuda = false);

}  // namespace tide
