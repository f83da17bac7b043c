// Where a process sits in a job, read from the variables torchrun, Slurm's srun and
// Kubernetes Indexed Jobs set (the values below are the ones srun set in the private Slurm
// of parallel.slurm, and a Job's pods get from deploy/kubernetes).
#include <gtest/gtest.h>

#include <map>

#include "tide/engine/parallel/launch_env.h"

namespace tide {
namespace {

using Vars = std::map<std::string, std::string>;

std::optional<LaunchEnv> read(const Vars& vars) {
  return launch_env_from([&](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

std::string error_of(const Vars& vars) {
  try {
    read(vars);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LaunchEnv, APlainProcessAndABatchScriptsOwnShellAreNoRankOfAJob) {
  EXPECT_FALSE(read({}).has_value());
  // What sbatch's script sees (no step): a tide train it runs directly is one process.
  EXPECT_FALSE(read({{"SLURM_JOB_ID", "2"},
                     {"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "2"},
                     {"SLURM_NODEID", "0"},
                     {"SLURM_JOB_NODELIST", "tide-node"}})
                   .has_value());
  EXPECT_FALSE(read({{"WORLD_SIZE", ""}}).has_value()) << "an empty variable is an unset one";
}

TEST(LaunchEnv, TorchrunsVariables) {
  const auto e = read({{"WORLD_SIZE", "8"},
                       {"RANK", "5"},
                       {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_ADDR", "10.0.0.1"},
                       {"MASTER_PORT", "29611"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->world, 8);
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world, 4);
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 29611);
  // Without LOCAL_RANK: the place on the host when LOCAL_WORLD_SIZE is known, else the rank.
  EXPECT_EQ(read({{"WORLD_SIZE", "8"}, {"RANK", "5"}, {"LOCAL_WORLD_SIZE", "4"}})->local_rank, 1);
  EXPECT_EQ(read({{"WORLD_SIZE", "8"}, {"RANK", "5"}})->local_rank, 5);
  EXPECT_EQ(read({{"WORLD_SIZE", "8"}, {"RANK", "5"}})->local_world, 1);
}

TEST(LaunchEnv, AKubernetesIndexedJobsCompletionIndexIsTheRankWhereRankIsAbsent) {
  const Vars pod{{"WORLD_SIZE", "2"},
                 {"JOB_COMPLETION_INDEX", "1"},
                 {"MASTER_ADDR", "tide-llama-0.tide-llama"},
                 {"MASTER_PORT", "29500"}};
  const auto e = read(pod);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->world, 2);
  EXPECT_EQ(e->master_addr, "tide-llama-0.tide-llama");
  EXPECT_NE(e->launcher.find("JOB_COMPLETION_INDEX"), std::string::npos) << e->launcher;
  Vars with_rank = pod;
  with_rank["RANK"] = "0";
  EXPECT_EQ(read(with_rank)->rank, 0) << "RANK wins";
  Vars bad = pod;
  bad["JOB_COMPLETION_INDEX"] = "2";
  EXPECT_EQ(error_of(bad), "environment variable JOB_COMPLETION_INDEX: '2' is not an integer in [0, 1]");
}

TEST(LaunchEnv, ATaskOfAnSrunStep) {
  // Task 3 of `srun --nodes 2 --ntasks-per-node 2` in job 1234 on gpu[007-008].
  Vars task{{"SLURM_JOB_ID", "1234"},
            {"SLURM_STEP_ID", "0"},
            {"SLURM_PROCID", "3"},
            {"SLURM_NTASKS", "4"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_NODEID", "1"},
            {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
            {"SLURM_STEP_NODELIST", "gpu[007-008]"},
            {"SLURM_JOB_NODELIST", "gpu[006-008]"}};
  auto e = read(task);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world, 2);
  EXPECT_EQ(e->master_addr, "gpu007") << "the step's first node runs task 0";
  EXPECT_EQ(e->master_port, slurm_default_master_port(1234));
  EXPECT_EQ(e->launcher, "srun (Slurm job 1234)");
  // MASTER_ADDR and MASTER_PORT, where a script exports them, win.
  task["MASTER_ADDR"] = "10.0.0.7";
  task["MASTER_PORT"] = "29400";
  e = read(task);
  EXPECT_EQ(e->master_addr, "10.0.0.7");
  EXPECT_EQ(e->master_port, 29400);
  // No step node list: the job's.
  task.erase("SLURM_STEP_NODELIST");
  task.erase("MASTER_ADDR");
  EXPECT_EQ(read(task)->master_addr, "gpu006");
  // torchrun's variables win over Slurm's (torchrun started under srun).
  task["WORLD_SIZE"] = "16";
  task["RANK"] = "9";
  EXPECT_EQ(read(task)->world, 16);
  EXPECT_EQ(read(task)->rank, 9);
}

TEST(LaunchEnv, MalformedSlurmVariablesAreNamedWithTheirValues) {
  const Vars task{{"SLURM_JOB_ID", "7"},        {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "2"},        {"SLURM_NODEID", "0"},  {"SLURM_STEP_TASKS_PER_NODE", "2"},
                  {"SLURM_STEP_NODELIST", "n1"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Vars t = task;
    t[k] = v;
    return error_of(t);
  };
  EXPECT_EQ(with("SLURM_PROCID", "2"), "environment variable SLURM_PROCID: '2' is not an integer in [0, 1]");
  EXPECT_EQ(with("SLURM_NTASKS", "two"), "environment variable SLURM_NTASKS: 'two' is not an integer in [1, 1048576]");
  EXPECT_EQ(with("SLURM_STEP_NODELIST", "n[1-2"), "environment variable SLURM_STEP_NODELIST='n[1-2': '[' without ']'");
  EXPECT_EQ(with("SLURM_STEP_TASKS_PER_NODE", "2(x"),
            "environment variable SLURM_STEP_TASKS_PER_NODE='2(x': '2(x' is not N or N(xK)");
  EXPECT_EQ(with("SLURM_NODEID", "1"),
            "environment variable SLURM_STEP_TASKS_PER_NODE='2': no entry for node 1 (the list covers 1 nodes)");
  EXPECT_EQ(with("SLURM_JOB_ID", "x"),
            "environment variable SLURM_JOB_ID: 'x' is not an integer in [0, 4611686018427387904]");
}

TEST(LaunchEnv, FirstHostOfASlurmHostList) {
  EXPECT_EQ(first_host_of_slurm_nodelist("tide-node"), "tide-node");
  EXPECT_EQ(first_host_of_slurm_nodelist("gpu[007-010,12],login1"), "gpu007");
  EXPECT_EQ(first_host_of_slurm_nodelist("gpu[12,007-010]"), "gpu12");
  EXPECT_EQ(first_host_of_slurm_nodelist("rack[1-2]-n[03-04]"), "rack1-n03");
  EXPECT_EQ(first_host_of_slurm_nodelist("a,b[1-3]"), "a");
  for (const char* bad : {"", ",a", "n[", "n[]", "n[x-y]", "n]1["}) {
    EXPECT_THROW(first_host_of_slurm_nodelist(bad), std::invalid_argument) << bad;
  }
}

TEST(LaunchEnv, SlurmTasksPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("2", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4), std::invalid_argument);
  EXPECT_THROW(slurm_tasks_on_node("0", 0), std::invalid_argument);
  EXPECT_THROW(slurm_tasks_on_node("2(x0)", 0), std::invalid_argument);
}

TEST(LaunchEnv, DefaultSlurmPortsDifferForTheJobsOfAnArrayAndStayBelowEphemeralPorts) {
  for (long job : {0L, 1L, 9999L, 123456789L}) {
    EXPECT_GE(slurm_default_master_port(job), 20000);
    EXPECT_LT(slurm_default_master_port(job), 32768) << "Linux's ephemeral ports start at 32768";
  }
  EXPECT_NE(slurm_default_master_port(4100), slurm_default_master_port(4101));
}

TEST(LaunchEnv, CudaDeviceOfALocalRank) {
  EXPECT_EQ(cuda_device_of_local_rank(3, 8, false), 3);
  EXPECT_EQ(cuda_device_of_local_rank(3, 1, false), 0) << "a GPU of its own (--gpus-per-task=1)";
  EXPECT_EQ(cuda_device_of_local_rank(3, 2, true), 1) << "Gloo ranks share round robin";
  EXPECT_THROW(cuda_device_of_local_rank(3, 2, false), std::invalid_argument);
  EXPECT_THROW(cuda_device_of_local_rank(0, 0, false), std::invalid_argument);
}

}  // namespace
}  // namespace tide
