#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tide/ipc/run_registry.h"
#include "temp_dir.h"

namespace tide::ipc {
namespace {
namespace fs = std::filesystem;

TEST(RunRegistry, RecordsSurviveAReload) {
  testing::TempDir dir("tide-registry");
  std::string id;
  {
    RunRegistry reg(dir.path.string());
    RunRecord r;
    r.id = id = reg.allocate("llama-tiny");
    r.name = "llama-tiny";
    r.seq = reg.next_seq();
    r.state = RunState::paused;
    r.workers = 2;
    r.overrides = {"optimizer.lr=1e-4"};
    r.live["optimizer.lr"] = 5e-4;
    r.final_loss = 2.5;
    r.idempotency_key = "k1";
    reg.save(r);
  }
  RunRegistry reg(dir.path.string());
  const RunRecord* r = reg.find(id);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->state, RunState::paused);
  EXPECT_EQ(r->workers, 2);
  EXPECT_EQ(r->overrides, std::vector<std::string>{"optimizer.lr=1e-4"});
  EXPECT_EQ(r->live["optimizer.lr"], 5e-4);
  EXPECT_EQ(r->final_loss, 2.5);
  EXPECT_EQ(reg.find_by_key("k1"), r);
  EXPECT_EQ(reg.find_by_key(""), nullptr);
  // Ids keep counting after a reload: never reused.
  EXPECT_EQ(reg.allocate("llama-tiny"), "llama-tiny-2");
}

TEST(RunRegistry, ABrokenRecordIsSkipped) {
  testing::TempDir dir("tide-registry");
  fs::create_directories(dir.path / "runs" / "bad-1");
  std::ofstream(dir.path / "runs" / "bad-1" / "run.json") << "{ not json";
  RunRegistry reg(dir.path.string());
  EXPECT_TRUE(reg.all().empty());
}

TEST(RunState, NamesRoundTrip) {
  for (int i = 0; i <= static_cast<int>(RunState::cancelled); ++i) {
    const auto s = static_cast<RunState>(i);
    EXPECT_EQ(state_from_name(state_name(s)), s);
  }
  EXPECT_FALSE(state_from_name("exploded"));
  EXPECT_TRUE(is_finished(RunState::stopped));
  EXPECT_TRUE(has_workers(RunState::paused));
  EXPECT_FALSE(has_workers(RunState::queued));
}

}  // namespace
}  // namespace tide::ipc
