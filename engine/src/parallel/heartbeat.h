// Each rank's pulse in the rendezvous store, and what the ranks conclude from the others'
// (internal to parallel/).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_impl.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/store_client.h"

namespace tide {

// Every second each rank publishes its time, the collectives it completed, the one it
// waits in and its host (`tide/heartbeat/<rank>`). It also watches its peers' (all of
// them up to 64 ranks; beyond, its neighbours r - 1, r + 1 and rank 0, so that a lost
// host is still seen by someone and the others fail on the connections it drops). A
// watched rank whose pulse has not changed for `node_timeout` (measured on this host's
// clock, so clock skew between hosts does not matter), or a rendezvous store unreachable
// that long, means a lost host: the rank logs which host and ranks and exits with
// kPeerLostExitStatus, since its own collectives may be blocked for parallel.timeout_s.
// One thread talks to the store, another judges the times: a store operation over a dead
// link can block for good (c10d's client reads replies without a timeout).
struct Distributed::Heartbeat {
  // node_timeout 0: watch nothing. host: how the peers name this one.
  Heartbeat(const LaunchEnv& env, std::chrono::milliseconds timeout, std::chrono::milliseconds node_timeout,
            std::string host);
  ~Heartbeat();

  // For an error message about a failed collective of `ranks`: what each other rank is
  // doing. Reads their pulses twice, 2.5 beats apart, so a rank killed a moment ago reads
  // as silent rather than alive; silent ranks are grouped by host.
  std::string describe(const std::vector<int>& ranks);

  std::shared_ptr<CommProgress> progress = std::make_shared<CommProgress>();

 private:
  struct Pulse {
    std::string value;                             // as published, "" before the first
    std::chrono::steady_clock::time_point change;  // here, when it last changed
  };
  void run();    // publishes and reads the pulses
  void judge();  // decides from their times
  [[noreturn]] void lost(const std::vector<int>& silent, double seconds);
  std::string host_of(int r);  // with mu_ held

  LaunchEnv env_;
  std::chrono::milliseconds timeout_, node_timeout_;
  std::string host_;
  StoreClient store_;  // the heartbeat thread's only
  std::vector<int> watched_;
  std::mutex mu_;  // guards what follows; never held across a store operation
  std::map<int, Pulse> pulses_;
  std::chrono::steady_clock::time_point store_reached_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_, judge_;
};

}  // namespace tide
