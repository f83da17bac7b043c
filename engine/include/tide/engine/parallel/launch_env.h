// Where this process sits in a job, from the environment torchrun, Slurm scripts and
// Kubernetes indexed Jobs already set: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT.
#pragma once

#include <optional>
#include <string>

namespace tide {

struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Reads the variables; nullopt when WORLD_SIZE is unset (a plain single process).
// Throws std::invalid_argument naming the variable and the value when one is malformed.
std::optional<LaunchEnv> launch_env_from_environment();

}  // namespace tide
