// A run's ranks as one Slurm batch job: tided writes the job's script into the run
// directory, submits it with sbatch, follows its state with squeue and ends it with
// scancel. The script's srun starts one tide-worker per rank, each of which reads its
// place from Slurm's variables (launch_env.h) and connects back to the controller's TCP
// worker socket with the run's CURVE key (docs/multinode.md, "tided on Slurm").
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "run_executor.h"

namespace tide::ipc {

struct SlurmJobSpec {
  std::string name;  // the job's name: tide-<run id>
  std::string executable;
  std::vector<std::string> args;           // after argv[0], as for local workers
  std::map<std::string, std::string> env;  // exported by the script to every rank
  int ranks = 1;
  bool gpus = false;                     // one GPU per rank (--gpus-per-task=1)
  int gpus_per_node = 8;                 // with gpus: ranks placed per node
  int cpus_per_task = 0;                 // 0: the cluster's default
  std::string working_dir;               // where the ranks start (the run's workdir; shared with the nodes)
  std::string run_dir;                   // the script, slurm-<job>.out and worker-rank<N>.log go here
  std::vector<std::string> sbatch_args;  // the operator's (partition, account, time): they win
};

// The text of the batch script for a spec.
std::string slurm_batch_script(const SlurmJobSpec& spec);

class SlurmJob : public RunExecutor {
 public:
  // Writes <run_dir>/slurm-job.sh and submits it; throws with sbatch's own message when
  // it refuses (no such partition, a limit) or does not answer within a minute.
  explicit SlurmJob(const SlurmJobSpec& spec);
  // A job still queued or running is cancelled: a controller that drops a run leaves
  // nothing of it on the cluster.
  ~SlurmJob() override;

  std::vector<std::string> reap() override;
  bool all_ended() const override;
  std::map<int, LiveRank> live() const override;
  // scancel: Slurm sends SIGTERM to the ranks and SIGKILL after its KillWait; after
  // `grace` the job gets SIGKILL from here too.
  void terminate(std::chrono::milliseconds grace) override;
  void enforce_deadline() override;
  void end(std::chrono::milliseconds grace) override;
  void describe(nlohmann::json& status) const override;
  nlohmann::json scheduler() const override;

  const std::string& id() const { return id_; }

 private:
  void follow();  // the thread: squeue every two seconds, scancel when asked
  // One line of squeue: "STATE|NODES|REASON".
  void observe(const std::string& line);

  int ranks_;
  std::string id_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::string state_ = "PENDING", nodes_;
  std::string reason_;  // why a PENDING job waits (Resources, Priority, PartitionConfig)
  bool ended_ = false, reported_ = false, quit_ = false;
  bool cancel_asked_ = false, cancel_sent_ = false, kill_asked_ = false, kill_sent_ = false;
  Clock::time_point running_since_{}, kill_at_ = Clock::time_point::max(), give_up_at_ = Clock::time_point::max();
  std::thread follower_;
};

// Whether a job in this state (squeue's %T) will not run again; "GONE" is a job
// slurmctld no longer knows. A requeued job is PENDING again, not final.
bool slurm_state_is_final(const std::string& state);

// Cancels a job a previous controller submitted for a run (it may outlive a crashed
// tided); a job that has ended already is no error.
void cancel_slurm_job(const std::string& id);

}  // namespace tide::ipc
