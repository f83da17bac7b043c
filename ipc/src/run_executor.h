// How a run's ranks start and end: as worker processes of this machine (LocalWorkers)
// or as a job a scheduler places (SlurmJob). The supervisor watches and ends a run
// through this alone; its ranks speak to the controller over the worker socket either
// way, so status, metrics, live control and checkpoints do not depend on which.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/ipc/worker_group.h"

namespace tide::ipc {

class RunExecutor {
 public:
  using Clock = std::chrono::steady_clock;
  struct LiveRank {
    std::string who;          // "pid 4242", "Slurm job 12 on node07": for messages
    Clock::time_point since;  // running since: its heartbeats are due from here on
  };

  virtual ~RunExecutor() = default;

  // What ended badly since the last call, each described ("rank 1 (pid 4242) was killed
  // by signal 9 (Killed)"); never blocks.
  virtual std::vector<std::string> reap() = 0;
  virtual bool all_ended() const = 0;
  // The ranks that run now, which must send heartbeats (none while a job waits in a queue).
  virtual std::map<int, LiveRank> live() const = 0;
  // Asks every rank to end now (SIGTERM, scancel); those left after `grace` are killed.
  virtual void terminate(std::chrono::milliseconds grace) = 0;
  // Kills what is left once terminate()'s grace has passed.
  virtual void enforce_deadline() = 0;
  // Blocks until every rank has ended (terminate, then kill after `grace`).
  virtual void end(std::chrono::milliseconds grace) = 0;
  // Adds what a status reply shows of it: pids, or the scheduler's job.
  virtual void describe(nlohmann::json& status) const = 0;
  // The scheduler's view for the run's record ({"slurm_job": "12", "state": "RUNNING",
  // "nodes": "node07"}, with "reason" while it waits); null for local workers.
  virtual nlohmann::json scheduler() const { return nullptr; }
};

// The ranks as processes of this machine (a WorkerGroup): a run of tide train --nproc
// under the controller.
class LocalWorkers : public RunExecutor {
 public:
  explicit LocalWorkers(const WorkerSpec& spec);
  std::vector<std::string> reap() override;
  bool all_ended() const override { return group_.all_ended(); }
  std::map<int, LiveRank> live() const override;
  void terminate(std::chrono::milliseconds grace) override { group_.terminate(grace); }
  void enforce_deadline() override { group_.enforce_deadline(); }
  void end(std::chrono::milliseconds grace) override { (void)group_.end(grace); }
  void describe(nlohmann::json& status) const override;

 private:
  WorkerGroup group_;
  Clock::time_point started_ = Clock::now();
};

}  // namespace tide::ipc
