// The worker processes of one run on this node: started with the rendezvous environment
// that torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), watched
// without blocking, and ended together. Workers run in their own process group. Used by `tide train --nproc` and by the
// controller's supervisor.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace tide::ipc {

// The tide-worker executable that belongs with a program or library in `dir`: in `dir`
// itself (the build tree's tools/), in ../bin (an installation) or in ../tools (a
// library in the build tree's capi/). Empty when none exists.
std::string find_tide_worker(const std::string& dir);

struct WorkerSpec {
  std::string executable;         // the worker program (the tide binary)
  std::vector<std::string> args;  // after argv[0]
  int nproc = 1;                  // workers on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // empty: 127.0.0.1 and a free port (single node)
  int master_port = 0;
  std::map<std::string, std::string> env;  // more variables for every worker
  std::string working_dir;                 // empty: this process's
  std::string log_dir;  // stdout and stderr to worker-rank<N>.log there; empty: inherited
  std::string log_file;  // one worker: its stdout and stderr here instead
  // Workers get SIGKILL when the thread that started them ends (a crashed daemon leaves
  // no orphan training on its devices).
  bool die_with_parent = false;
};

struct WorkerExit {
  int rank = 0;
  pid_t pid = 0;
  int status = 0;  // as waitpid reports it
  bool ok() const;
  std::string describe() const;  // "exited with status 1", "was killed by signal 9 (Killed)"
};

class WorkerGroup {
 public:
  // Starts every worker of this node; throws when one cannot be started (the ones
  // already started are killed).
  explicit WorkerGroup(const WorkerSpec& spec);
  // Kills (SIGKILL) and reaps what is still running.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // The workers that have ended since the last call (never blocks).
  std::vector<WorkerExit> reap();
  bool all_ended() const { return live_.empty(); }
  size_t live_count() const { return live_.size(); }
  // rank → pid of the workers still running.
  const std::map<pid_t, int>& live() const { return live_; }
  // SIGTERM to every live worker now, SIGKILL to those left after `grace` (call reap()
  // or end() to collect them).
  void terminate(std::chrono::milliseconds grace);
  // Blocks until every worker has ended: SIGTERM, then SIGKILL after `grace`.
  std::vector<WorkerExit> end(std::chrono::milliseconds grace);
  // Sends SIGKILL to workers whose grace after terminate() has passed.
  void enforce_deadline();

  const std::string& master() const { return master_; }

 private:
  std::map<pid_t, int> live_;  // pid → global rank
  std::string master_;
  std::chrono::steady_clock::time_point kill_at_ = std::chrono::steady_clock::time_point::max();
};

// A TCP port on 127.0.0.1 free at the moment of asking.
int free_loopback_port();

}  // namespace tide::ipc
