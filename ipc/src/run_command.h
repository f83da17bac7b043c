// A program run to its end with its output captured, bounded in time: how the controller
// speaks to a scheduler's commands (sbatch, squeue, scancel), so that a hung scheduler
// can delay the controller's caller but never hold it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace tide::ipc {

struct CommandResult {
  int status = -1;         // as waitpid reports it; -1 when the program could not start
  bool timed_out = false;  // killed (SIGKILL) at the time limit
  std::string out, err;    // each kept to its first MiB
  bool ok() const;         // exited with status 0 in time
  // "`squeue -j 12` exited with status 1: squeue: error: Invalid job id specified"
  std::string describe(const std::vector<std::string>& argv) const;
};

// Runs argv[0] (searched on PATH) with argv, stdin from /dev/null; safe to call from any
// thread (nothing but async-signal-safe calls between fork and exec).
CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

}  // namespace tide::ipc
