// A rank's view of its job: the grid and a communicator for each of its groups.
#pragma once

#include <memory>

#include "tide/engine/config.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/grid.h"
#include "tide/engine/parallel/launch_env.h"

namespace tide {

// The exit status of a rank that ended because a peer's host went silent
// (parallel.node_timeout_s): the job can go on from its newest checkpoint once the host
// is back, or on fewer hosts.
constexpr int kPeerLostExitStatus = 75;

struct Distributed {
  Grid grid;
  LaunchEnv env;  // where the rendezvous store is (StoreClient)
  std::unique_ptr<Comm> world, dp, tp, pp;
  // The context-parallel ranks of this rank's sequences, and the dp x cp ranks that hold
  // the same parameters (Grid::replica_group); both null without context parallelism,
  // where the replicas are the dp ranks.
  std::unique_ptr<Comm> cp, dp_cp;
  // Expert parallelism (parallel.ep > 1): the ranks this rank's experts are spread over,
  // and the ranks that hold the same experts (Grid::ep_group, expert_replica_group); both
  // null without.
  std::unique_ptr<Comm> ep, expert_replicas;
  // Every rank again, over Gloo on the host whatever the device: the control plane (live
  // commands, anomaly decisions) meets at each step boundary, and on a GPU a broadcast
  // there through NCCL would make the host wait for the device's queued work. Null where
  // this LibTorch has no Gloo (the world group carries control then, waiting).
  std::unique_ptr<Comm> host;
  // The first and the last pipeline stage of this rank's (dp, tp) pipeline, which both
  // hold tied embeddings; null on the stages in between.
  std::unique_ptr<Comm> embedding;
  struct Store;  // keeps the rendezvous store alive
  std::shared_ptr<Store> store;
  // Publishes this rank's collective progress every second, so that a rank whose
  // collective times out names the peers that are silent (stopped, dead) or elsewhere.
  struct Heartbeat;
  std::shared_ptr<Heartbeat> heartbeat;

  // The group that carries control: `host`, or `world` without Gloo.
  Comm* control() const { return host ? host.get() : world.get(); }
  // The ranks that reduce gradients together and shard ZeRO's state: dp x cp.
  Comm& replicas() const { return dp_cp ? *dp_cp : *dp; }
};

// Rendezvous through a TCPStore hosted by rank 0 at MASTER_ADDR:MASTER_PORT, then one
// process group per grid axis, and the heartbeat. Gloo for CPU ranks; NCCL for CUDA ranks
// (`cuda`) unless parallel.backend is "gloo". Every collective and the rendezvous give up after
// `timeout`, with an error naming the group and the operation. Sets SIGPIPE to ignored
// for the process, as Gloo needs (a dead peer must fail a collective, not kill the rank).
std::unique_ptr<Distributed> init_distributed(const LaunchEnv& env, const ParallelConfig& parallel,
                                              std::chrono::milliseconds timeout, bool cuda = false);

}  // namespace tide
