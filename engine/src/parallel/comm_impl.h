// Comm's state; shared by comm.cpp and distributed.cpp only.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "tide/engine/parallel/comm.h"

namespace tide {

// A process group's per-device half (ProcessGroupGloo and ProcessGroupNCCL are c10d
// backends): tide drives one backend per group directly.
using CollectiveBackend = c10d::Backend;

// What this process is doing with its collectives, shared by its groups: the
// heartbeat publishes it, so that a rank whose collective times out can tell which
// peer is stopped and which is alive but elsewhere.
struct CommProgress {
  std::atomic<int64_t> completed{0};
  std::mutex mu;
  std::string waiting;  // the collective being waited for, empty between collectives
};

struct Comm::Impl {
  std::string name;
  std::vector<int> ranks;
  int group_rank = 0;
  bool gloo = true;
  c10::Device device{c10::kCPU};  // where the backend's tensors live: the host (Gloo), this rank's GPU (NCCL)
  std::chrono::milliseconds timeout{60000};
  c10::intrusive_ptr<CollectiveBackend> pg;  // null for a group of one
  int64_t bytes_sent = 0;
  double wait_seconds = 0;  // the host blocked in wait()
  std::shared_ptr<CommProgress> progress;
  // The state of the group's other ranks, for an error message (may be empty).
  std::function<std::string(const std::vector<int>& ranks)> diagnose;

  // The tensor the backend moves: `t`, or its copy on `device`.
  at::Tensor staged(const at::Tensor& t) const;
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& op, const std::string& what);
  void all_reduce(Comm& c, at::Tensor& t, c10d::ReduceOp op, const std::string& name, const std::string& what);
};

}  // namespace tide
