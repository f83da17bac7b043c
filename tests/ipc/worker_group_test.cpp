#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

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

TEST(WorkerGroup, AWorkerThatCannotStartExitsWith127) {
  WorkerSpec spec;
  spec.executable = "/nonexistent/tide";
  WorkerGroup g(spec);
  const auto exits = wait_all(g);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].describe(), "exited with status 127");
}

}  // namespace
}  // namespace tide::ipc
