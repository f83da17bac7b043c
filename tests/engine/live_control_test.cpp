// Live control through the trainer's hooks, in one process: commands taken at step
// boundaries change the run exactly there.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_data.h"
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/trainer.h"
#include "tiny_models.h"

namespace tide {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

RunConfig control_run() {
  RunConfig c;
  c.name = "live";
  c.model = testing::tiny_llama();
  c.model.vocab_size = 257;
  c.data.path = testing::small_dataset();
  c.data.seq_len = 32;
  c.batch.micro_batch = 4;
  c.batch.global_batch = 8;
  c.optimizer.lr = 1e-3;
  c.schedule.steps = 20;
  c.schedule.decay = DecayKind::Constant;
  c.eval.every = 0;
  c.checkpoint.async = false;
  c.threads = 1;
  return c;
}

struct Scripted {
  std::map<int, json> at_call;  // the n-th take_commands call → commands
  int calls = 0;
  std::vector<std::pair<std::string, json>> events;
};

// Hooks that hand the trainer the script's commands and record its events.
TrainHooks scripted_hooks(const std::shared_ptr<Scripted>& script) {
  TrainHooks hooks;
  hooks.show_progress = false;
  hooks.peak_flops = 1e12;
  hooks.controlled = true;
  hooks.take_commands = [script] {
    const auto it = script->at_call.find(script->calls++);
    return it == script->at_call.end() ? std::string() : it->second.dump();
  };
  hooks.on_event = [script](const std::string& kind, const json& body) { script->events.emplace_back(kind, body); };
  return hooks;
}

TEST(LiveControl, CommandsApplyAtTheirStepBoundary) {
  const fs::path dir = fs::temp_directory_path() / ("tide_live_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto script = std::make_shared<Scripted>();
  // One call per boundary: call n comes before 0-based step n.
  script->at_call[3] = json::array({{{"op", "set"}, {"id", 1}, {"values", {{"optimizer.lr", 5e-4}}}}});
  script->at_call[5] = json::array({{{"op", "set"}, {"id", 2}, {"values", {{"model.dim", 64}}}},
                                    {{"op", "set"}, {"id", 3}, {"values", {{"batch.global_batch", 16}}}},
                                    {{"op", "checkpoint"}}});
  script->at_call[7] = json::array({{{"op", "set"}, {"id", 4}, {"values", {{"batch.global_batch", 10}}}},
                                    {{"op", "stop"}}});
  const TrainHooks hooks = scripted_hooks(script);
  const TrainResult r = Trainer(control_run(), dir.string(), hooks).run();

  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.steps, 7);
  std::vector<json> rows;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_DOUBLE_EQ(rows[2]["lr"].get<double>(), 1e-3);
  EXPECT_DOUBLE_EQ(rows[3]["lr"].get<double>(), 5e-4);  // 0-based step 3
  EXPECT_EQ(rows[3]["changes"], json({{"optimizer.lr", 5e-4}}));
  // The larger batch from step 5 on: twice the tokens of a step before it.
  EXPECT_EQ(rows[5]["tokens"].get<int64_t>() - rows[4]["tokens"].get<int64_t>(), 16 * 32);
  EXPECT_EQ(rows[4]["tokens"].get<int64_t>() - rows[3]["tokens"].get<int64_t>(), 8 * 32);
  // Checkpoints: asked for before step 5, and the stop's before step 7.
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step-00000005" / "COMMITTED"));
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step-00000007" / "COMMITTED"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors")) << "a stopped run leaves its checkpoint, not final weights";
  // Loading the run for generate or eval says how to reach those weights.
  try {
    load_model(dir.string());
    ADD_FAILURE() << "a stopped run loaded without final weights";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tide ckpt export " + (dir / "checkpoints" / "step-00000007").string()),
              std::string::npos)
        << e.what();
  }

  std::map<int, std::string> result_of;
  for (const auto& [kind, body] : script->events)
    if (body.contains("id")) result_of[body["id"].get<int>()] = kind;
  EXPECT_EQ(result_of[1], "applied");
  EXPECT_EQ(result_of[2], "rejected");  // not a live field
  EXPECT_EQ(result_of[3], "applied");
  EXPECT_EQ(result_of[4], "rejected");  // 10 does not split into micro-batches of 4
  bool stopping = false;
  for (const auto& [kind, body] : script->events) stopping |= kind == "stopping" && body["step"] == 7;
  EXPECT_TRUE(stopping);
  fs::remove_all(dir);
}

TEST(LiveControl, PauseHoldsTheRunUntilResume) {
  const fs::path dir = fs::temp_directory_path() / ("tide_pause_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto script = std::make_shared<Scripted>();
  script->at_call[2] = json::array({{{"op", "pause"}}});
  script->at_call[6] = json::array({{{"op", "resume"}}});  // four polls later
  RunConfig c = control_run();
  c.schedule.steps = 4;
  const TrainHooks hooks = scripted_hooks(script);
  const TrainResult r = Trainer(c, dir.string(), hooks).run();
  EXPECT_EQ(r.steps, 4);
  EXPECT_FALSE(r.stopped);
  ASSERT_GE(script->events.size(), 2u);
  EXPECT_EQ(script->events[0].first, "paused");
  EXPECT_EQ(script->events[0].second["step"], 2);
  EXPECT_EQ(script->events[1].first, "resumed");
  EXPECT_EQ(script->events[1].second["step"], 2);
  EXPECT_EQ(script->calls, 4 + 4) << "one call per boundary, and four while paused";
  fs::remove_all(dir);
}

TEST(LiveControl, ProfilingSetLiveToAStepAlreadyBegunRecordsTheNextSteps) {
  const fs::path dir = fs::temp_directory_path() / ("tide_live_profile_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto script = std::make_shared<Scripted>();
  script->at_call[4] =
      json::array({{{"op", "set"}, {"id", 1}, {"values", {{"profile.start_step", 1}, {"profile.steps", 2}}}}});
  RunConfig c = control_run();
  c.schedule.steps = 8;
  const TrainHooks hooks = scripted_hooks(script);
  Trainer(c, dir.string(), hooks).run();
  // Applied before 0-based step 4: steps 5 and 6 as the metrics count them.
  EXPECT_EQ(testing::file_names(dir / "profile"),
            (std::vector<std::string>{"steps-5-6-rank-0.summary.txt", "steps-5-6-rank-0.trace.json"}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tide
