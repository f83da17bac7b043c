#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "temp_dir.h"
#include "tide/ipc/worker_group.h"

namespace tide::ipc {
namespace {

std::vector<WorkerExit> wait_all(WorkerGroup& g) {
  std::vector<WorkerExit> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!g.all_ended() && std::chrono::steady_clock::now() < deadline) {
    for (auto& e : g.reap()) out.push_back(e);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return out;
}

TEST(WorkerGroup, GivesEachWorkerItsRankAndReportsExits) {
  WorkerSpec spec;
  spec.executable = "/bin/sh";
  // Each worker exits with its rank: the environment reached it.
  spec.args = {"-c", "test \"$WORLD_SIZE\" = 3 && test -n \"$MASTER_PORT\" && exit $RANK"};
  spec.nproc = 3;
  WorkerGroup g(spec);
  auto exits = wait_all(g);
  ASSERT_EQ(exits.size(), 3u);
  for (const auto& e : exits) {
    EXPECT_EQ(e.ok(), e.rank == 0);
    if (e.rank > 0) {
      EXPECT_EQ(e.describe(), "exited with status " + std::to_string(e.rank));
    }
  }
}

TEST(WorkerGroup, EndsWorkersThatIgnoreSigterm) {
  WorkerSpec spec;
  spec.executable = "/bin/sh";
  spec.args = {"-c", "trap '' TERM; while true; do sleep 0.05; done"};
  spec.nproc = 2;
  WorkerGroup g(spec);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto exits = g.end(std::chrono::milliseconds(300));
  ASSERT_EQ(exits.size(), 2u);
  for (const auto& e : exits) EXPECT_EQ(e.describe(), "was killed by signal 9 (Killed)");
}

TEST(WorkerGroup, AWorkerGetsThisProcesssEnvironmentWithItsOwnVariablesOverIt) {
  // The environment is made before fork (the child may not allocate): inherited
  // variables pass, the spec's and the rank's replace this process's.
  ::setenv("TIDE_TEST_INHERITED", "kept", 1);
  ::setenv("TIDE_TEST_GIVEN", "this process's", 1);
  ::setenv("RANK", "99", 1);
  WorkerSpec spec;
  spec.executable = "/bin/sh";
  spec.args = {"-c", "test \"$TIDE_TEST_INHERITED\" = kept && test \"$TIDE_TEST_GIVEN\" = spec && exit $((RANK + 20))"};
  spec.env = {{"TIDE_TEST_GIVEN", "spec"}};
  spec.nproc = 2;
  WorkerGroup g(spec);
  auto exits = wait_all(g);
  ::unsetenv("TIDE_TEST_INHERITED");
  ::unsetenv("TIDE_TEST_GIVEN");
  ::unsetenv("RANK");
  ASSERT_EQ(exits.size(), 2u);
  for (const auto& e : exits) EXPECT_EQ(e.describe(), "exited with status " + std::to_string(e.rank + 20));
}

TEST(WorkerGroup, AWorkerThatCannotStartExitsWith127AndSaysWhyInItsLog) {
  testing::TempDir dir("tide-worker-group");
  std::filesystem::create_directories(dir.path);
  WorkerSpec spec;
  spec.executable = "/nonexistent/tide";
  spec.log_dir = dir.path.string();
  WorkerGroup g(spec);
  const auto exits = wait_all(g);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].describe(), "exited with status 127");
  std::ifstream log(dir.path / "worker-rank0.log");
  std::string line;
  std::getline(log, line);
  EXPECT_EQ(line, "rank 0: cannot start the worker /nonexistent/tide: No such file or directory");
}

}  // namespace
}  // namespace tide::ipc
