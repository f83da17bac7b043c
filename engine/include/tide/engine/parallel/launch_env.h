// Where this process sits in a job, from the environment its launcher already set, so
// that no wrapper script is needed (docs/multinode.md, "Launchers"):
//   torchrun, tide's own launcher, Kubernetes manifests: WORLD_SIZE, RANK, LOCAL_RANK,
//     LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; an Indexed Job's JOB_COMPLETION_INDEX
//     is the rank where RANK is absent;
//   Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//     SLURM_STEP_TASKS_PER_NODE, and the first host of the step's node list for the
//     rendezvous (MASTER_ADDR and MASTER_PORT, where set, win).
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace tide {

struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  int local_world = 1;  // ranks on this host
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "environment";  // what set the variables, for messages
};

// One environment variable's value, nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads the variables; nullopt when none of the launchers above started this process (a
// plain single process, or a Slurm batch script's own shell, which has SLURM_PROCID but
// is no task of a step). Throws std::invalid_argument naming the variable and the value
// when one is malformed.
std::optional<LaunchEnv> launch_env_from(const EnvLookup& lookup);
std::optional<LaunchEnv> launch_env_from_environment();

// The first host of a Slurm host list ("gpu[007-010,12],login1" → "gpu007").
std::string first_host_of_slurm_nodelist(const std::string& nodelist);
// The tasks Slurm placed on node `node` of a tasks-per-node list ("2(x3),1": nodes 0-2
// run 2, node 3 runs 1).
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);
// The rendezvous port of a Slurm job that sets no MASTER_PORT: one per job id, below
// Linux's ephemeral ports, so that the array tasks of a sweep sharing a node do not meet.
int slurm_default_master_port(long job_id);

// The CUDA device index of the local_rank-th rank of a host that sees `gpus` devices.
// One rank per GPU: local_rank itself, or 0 where the scheduler gave each rank one GPU of
// its own (Slurm's --gpus-per-task=1, one device visible). Ranks that may share GPUs
// (Gloo) go round robin. Throws std::invalid_argument when the ranks outnumber the GPUs.
int cuda_device_of_local_rank(int local_rank, int gpus, bool share_gpus);

}  // namespace tide
