// Starts the worker processes of one node and watches them: when one fails, the others
// are stopped and the failure is reported by rank.
#pragma once

#include <string>
#include <vector>

namespace tide::cli {

struct LaunchSpec {
  std::vector<std::string> worker_args;  // arguments after the executable
  int nproc = 1;                         // workers on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // empty: 127.0.0.1 and a free port (single node)
  int master_port = 0;
};

// Returns the exit status for the launcher: 0 when every worker succeeded.
int launch_workers(const LaunchSpec& spec);

}  // namespace tide::cli
