// A recipe's `profile` section: LibTorch's profiler around the named steps of a real run,
// its Chrome trace and summary on disk, and the summary's arithmetic.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../../engine/src/train/profile_summary.h"
#include "test_data.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/train/trainer.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

ProfiledEvent event(std::string name, ProfiledEvent::Kind kind, uint64_t thread, uint64_t start, uint64_t end,
                    uint64_t flops = 0) {
  ProfiledEvent e;
  e.name = std::move(name);
  e.kind = kind;
  e.thread = thread;
  e.start_ns = start;
  e.end_ns = end;
  e.flops = flops;
  return e;
}

const ProfileRow& row(const std::vector<ProfileRow>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return r;
  throw std::runtime_error("no row " + name);
}

TEST(ProfileSummary, SelfTimeIsAnOperatorsTimeLessTheOperatorsItCalls) {
  using K = ProfiledEvent::Kind;
  // One step on thread 1: linear [10, 50) calls mm [20, 30); mm again at [60, 70);
  // thread 2 (autograd's, say) runs mm [5, 45) beside it, nested in nothing.
  const std::vector<ProfiledEvent> events{
      event("ProfilerStep#1", K::Annotation, 1, 0, 100), event("aten::linear", K::HostOp, 1, 10, 50),
      event("aten::mm", K::HostOp, 1, 20, 30, 1000),     event("aten::mm", K::HostOp, 1, 60, 70, 1000),
      event("aten::mm", K::HostOp, 2, 5, 45, 4000),
  };
  const ProfileSummary s = summarize_profile(events);
  EXPECT_DOUBLE_EQ(s.wall_seconds, 100e-9);
  ASSERT_EQ(s.host.size(), 2u);
  EXPECT_EQ(s.host[0].name, "aten::mm");  // 10 + 10 + 40 ns
  EXPECT_EQ(s.host[0].calls, 3);
  EXPECT_DOUBLE_EQ(s.host[0].seconds, 60e-9);
  EXPECT_EQ(s.host[0].flops, 6000u);
  EXPECT_DOUBLE_EQ(row(s.host, "aten::linear").seconds, 30e-9);
  // The step's 100 ns less linear's 40 and the second mm's 10.
  EXPECT_DOUBLE_EQ(s.outside_operators_seconds, 50e-9);
  EXPECT_TRUE(s.device.empty());
  const std::string text = format_profile_summary(s, 1, 10);
  EXPECT_NE(text.find("aten::linear"), std::string::npos) << text;
  EXPECT_NE(text.find("100.0"), std::string::npos) << text;  // mm's rate: 6000 flops in 60 ns, GFLOP/s
}

TEST(ProfileSummary, AnEventEndingWithItsParentIsItsChildAndOneStartingAtItsEndIsNot) {
  using K = ProfiledEvent::Kind;
  const std::vector<ProfiledEvent> events{event("outer", K::HostOp, 1, 0, 40), event("inner", K::HostOp, 1, 20, 40),
                                          event("next", K::HostOp, 1, 40, 50)};
  const ProfileSummary s = summarize_profile(events);
  EXPECT_DOUBLE_EQ(row(s.host, "outer").seconds, 20e-9);
  EXPECT_DOUBLE_EQ(row(s.host, "inner").seconds, 20e-9);
  EXPECT_DOUBLE_EQ(row(s.host, "next").seconds, 10e-9);
}

TEST(ProfileSummary, TheDeviceIsBusyWhileAnyOfItsEventsRuns) {
  using K = ProfiledEvent::Kind;
  // Two streams overlap on [20, 25); a gap from 40 to 80.
  const std::vector<ProfiledEvent> events{event("launch", K::HostOp, 1, 0, 100), event("gemm", K::Device, 7, 10, 25),
                                          event("rmsnorm", K::Device, 8, 20, 40), event("gemm", K::Device, 7, 80, 90)};
  const ProfileSummary s = summarize_profile(events);
  EXPECT_DOUBLE_EQ(s.device_busy_seconds, 40e-9);
  ASSERT_EQ(s.device.size(), 2u);
  EXPECT_EQ(s.device[0].name, "gemm");
  EXPECT_EQ(s.device[0].calls, 2);
  EXPECT_DOUBLE_EQ(s.device[0].seconds, 25e-9);
  const std::string text = format_profile_summary(s, 1, 10);
  EXPECT_NE(text.find("idle 60.0%"), std::string::npos) << text;
}

TEST(ProfileSummary, DeviceTimeGoesToTheOperatorsThatLaunchedIt) {
  using K = ProfiledEvent::Kind;
  auto with = [](ProfiledEvent e, uint64_t correlation, uint64_t launched_by = 0) {
    e.correlation = correlation;
    e.launched_by = launched_by;
    return e;
  };
  const std::string node = "torch::autograd::CppNode<tide::(anonymous namespace)::RmsNormFn>";
  const std::vector<ProfiledEvent> events{
      // Thread 1, forward: linear calls mm, reshape calls copy_, inside two annotations; the
      // runtime's launch call has an id of CUPTI's, not taken for an operator's (0 here).
      with(event("ProfilerStep#4", K::Annotation, 1, 0, 300), 8),
      with(event("tide::forward_backward", K::Annotation, 1, 0, 200), 1),
      with(event("aten::linear", K::HostOp, 1, 10, 60), 2),
      with(event("aten::mm", K::HostOp, 1, 20, 30), 3),
      event("cudaLaunchKernel", K::HostOp, 1, 21, 22),
      with(event("aten::reshape", K::HostOp, 1, 70, 90), 4),
      with(event("aten::copy_", K::HostOp, 1, 75, 85), 5),
      // Thread 2, autograd's: a backward node inside its wrapper.
      with(event("autograd::engine::evaluate_function: " + node, K::HostOp, 2, 100, 150), 6),
      with(event(node, K::HostOp, 2, 105, 145), 7),
      // The device: what each launched, a replayed graph's kernel (launched in an
      // annotation), and two whose launcher is not known.
      with(event("gemm", K::Device, 7, 30, 50), 0, 3),
      with(event("gemm", K::Device, 7, 50, 60), 0, 3),
      with(event("copy", K::Device, 7, 86, 90), 0, 5),
      with(event("rmsnorm_backward", K::Device, 7, 150, 160), 0, 7),
      with(event("graph_kernel", K::Device, 7, 160, 170), 0, 1),
      with(event("step_kernel", K::Device, 7, 170, 171), 0, 8),
      with(event("unlinked", K::Device, 7, 180, 183), 0, 0),
      with(event("unknown", K::Device, 7, 190, 192), 0, 99),
  };
  const ProfileSummary s = summarize_profile(events);
  ASSERT_EQ(s.launched_by.size(), 6u);
  EXPECT_EQ(s.launched_by[0].name, "aten::linear > aten::mm");
  EXPECT_EQ(s.launched_by[0].calls, 2);
  EXPECT_DOUBLE_EQ(s.launched_by[0].seconds, 30e-9);
  EXPECT_DOUBLE_EQ(row(s.launched_by, "torch::autograd::CppNode<tide::RmsNormFn>").seconds, 10e-9);
  EXPECT_DOUBLE_EQ(row(s.launched_by, "tide::forward_backward").seconds, 10e-9);
  EXPECT_DOUBLE_EQ(row(s.launched_by, "aten::reshape > aten::copy_").seconds, 4e-9);
  EXPECT_DOUBLE_EQ(row(s.launched_by, "(no operator recorded)").seconds, 5e-9);
  EXPECT_EQ(row(s.launched_by, "(no operator recorded)").calls, 2);
  EXPECT_DOUBLE_EQ(row(s.launched_by, "ProfilerStep").seconds, 1e-9);
  // Every device event is counted once, in one row.
  double total = 0, launched = 0;
  for (const auto& r : s.device) total += r.seconds;
  for (const auto& r : s.launched_by) launched += r.seconds;
  EXPECT_DOUBLE_EQ(launched, total);
  const std::string text = format_profile_summary(s, 1, 10);
  EXPECT_NE(text.find("device time by the operator that launched it"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::reshape > aten::copy_"), std::string::npos) << text;
}

RunConfig profiled_run(const std::string& name, int64_t steps) {
  RunConfig c = testing::tiny_byte_run(name);
  c.schedule.steps = steps;
  return c;
}

// An empty place for a run named `name`, unique to this process.
fs::path fresh_run_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("tide_profile_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

TrainHooks quiet() {
  TrainHooks h;
  h.show_progress = false;
  return h;
}

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::set<std::string> trace_names(const fs::path& trace) {
  std::ifstream in(trace);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& e : j.at("traceEvents"))
    if (e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
  return names;
}

TEST(Profile, ARunRecordsTheNamedStepsWithoutChangingThem) {
  const fs::path plain = fresh_run_dir("plain");
  const fs::path profiled = fresh_run_dir("on");
  Trainer(profiled_run("plain", 4), plain.string(), quiet()).run();
  RunConfig c = profiled_run("profiled", 4);
  c.profile.start_step = 2;
  c.profile.steps = 2;
  Trainer(c, profiled.string(), quiet()).run();

  EXPECT_FALSE(fs::exists(plain / "profile"));
  EXPECT_EQ(testing::file_names(profiled / "profile"),
            (std::vector<std::string>{"steps-2-3-rank-0.summary.txt", "steps-2-3-rank-0.trace.json"}));

  const std::set<std::string> names = trace_names(profiled / "profile" / "steps-2-3-rank-0.trace.json");
  for (const char* n : {"ProfilerStep#2", "ProfilerStep#3", "tide::forward_backward", "tide::update", "aten::mm"})
    EXPECT_EQ(names.count(n), 1u) << n;
  for (const char* n : {"ProfilerStep#1", "ProfilerStep#4"}) EXPECT_EQ(names.count(n), 0u) << n;

  std::ifstream summary_file(profiled / "profile" / "steps-2-3-rank-0.summary.txt");
  const std::string summary((std::istreambuf_iterator<char>(summary_file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(summary.rfind("2 steps, ", 0), 0u) << summary;
  EXPECT_NE(summary.find("aten::mm"), std::string::npos) << summary;
  bool logged = false;
  for (const auto& line : lines_of(profiled / "train.log"))
    logged |= line.find("profile: steps 2-3 written to") != std::string::npos;
  EXPECT_TRUE(logged);

  // The profiler observes: the losses are the unprofiled run's, bit for bit.
  EXPECT_EQ(lines_of(plain / "metrics.jsonl").size(), 4u);
  const auto losses = [](const fs::path& run) {
    std::vector<double> out;
    for (const auto& line : lines_of(run / "metrics.jsonl")) out.push_back(nlohmann::json::parse(line)["loss"]);
    return out;
  };
  EXPECT_EQ(losses(plain), losses(profiled));
  fs::remove_all(plain);
  fs::remove_all(profiled);
}

TEST(Profile, ARunEndingInsideTheRecordingWritesTheStepsItRecorded) {
  const fs::path dir = fresh_run_dir("end");
  RunConfig c = profiled_run("ends", 3);
  c.profile.start_step = 3;
  c.profile.steps = 5;
  Trainer(c, dir.string(), quiet()).run();
  EXPECT_TRUE(fs::exists(dir / "profile" / "steps-3-3-rank-0.trace.json"));
  EXPECT_TRUE(fs::exists(dir / "profile" / "steps-3-3-rank-0.summary.txt"));
  fs::remove_all(dir);
}

TEST(Profile, ARunResumedPastItsStartStepRecordsNothing) {
  const fs::path dir = fresh_run_dir("resume");
  RunConfig c = profiled_run("resumed", 4);
  c.checkpoint.async = false;
  Trainer(c, dir.string(), quiet()).run();
  c.schedule.steps = 6;
  c.profile.start_step = 2;
  TrainHooks resume = quiet();
  resume.resume = "auto";
  EXPECT_EQ(Trainer(c, dir.string(), resume).run().steps, 6);
  EXPECT_FALSE(fs::exists(dir / "profile"));
  fs::remove_all(dir);
}

TEST(Profile, ARankOutsideTheJobIsRefusedBeforeTheRunStarts) {
  const fs::path dir = fresh_run_dir("rank");
  RunConfig c = profiled_run("rank", 2);
  c.profile.start_step = 1;
  c.profile.ranks = {0, 2};
  try {
    const Trainer refused(c, dir.string(), quiet());
    FAIL() << "profile.ranks = {0, 2} accepted in a one-rank job";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "profile.ranks");
    EXPECT_NE(std::string(e.what()).find("rank 2 is not in this job of 1 rank"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST(Profile, AnEmptyRankListFromLuaReadsAsEveryRank) {
  nlohmann::json j = config_to_json(RunConfig{});
  j["profile"]["ranks"] = nlohmann::json::object();  // what an empty Lua table converts to
  EXPECT_TRUE(config_from_json(j).profile.ranks.empty());
  j["profile"]["ranks"] = {1, 3};
  EXPECT_EQ(config_from_json(j).profile.ranks, (std::vector<int64_t>{1, 3}));
  j["profile"]["ranks"] = "0";
  EXPECT_THROW(config_from_json(j), ConfigError);
}

}  // namespace
}  // namespace tide
