// Comm's state; shared by comm.cpp and distributed.cpp only.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "tide/engine/parallel/comm.h"

namespace tide {

struct Comm::Impl {
  std::string name;
  std::vector<int> ranks;
  int group_rank = 0;
  bool gloo = true;
  std::chrono::milliseconds timeout{60000};
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // null for a group of one
  int64_t bytes_sent = 0;

  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& op, const std::string& what);
  void all_reduce(Comm& c, at::Tensor& t, c10d::ReduceOp op, const std::string& name, const std::string& what);
};

}  // namespace tide
