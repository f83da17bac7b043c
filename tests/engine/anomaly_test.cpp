// Anomaly detection and the recipe's policies, through the trainer in one process.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_data.h"
#include "tide/engine/train/fault_injection.h"
#include "tide/engine/train/trainer.h"
#include "tiny_models.h"

namespace tide {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

RunConfig anomaly_run(int64_t steps) {
  RunConfig c = testing::tiny_byte_run("anomaly");
  c.optimizer.lr = 1e-3;
  c.schedule.steps = steps;
  c.schedule.decay = DecayKind::Constant;
  c.checkpoint.async = false;
  return c;
}

struct RunOutcome {
  TrainResult result;
  std::vector<json> rows;
  std::vector<json> anomalies;
};

RunOutcome train(const RunConfig& c, const std::string& inject, TrainHooks hooks = {}) {
  const fs::path dir = fs::temp_directory_path() / ("tide_anomaly_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // As a worker takes it from its environment.
  ::setenv("TIDE_INJECT_NAN_AT", inject.c_str(), 1);
  hooks.loss_tap = loss_tap_from_environment();
  ::unsetenv("TIDE_INJECT_NAN_AT");
  RunOutcome r;
  hooks.show_progress = false;
  hooks.peak_flops = 1e12;
  hooks.on_event = [&r](const std::string& kind, const json& body) {
    if (kind == "anomaly") r.anomalies.push_back(body);
  };
  r.result = Trainer(c, dir.string(), hooks).run();
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) r.rows.push_back(json::parse(line));
  fs::remove_all(dir);
  return r;
}

TEST(FaultInjection, MalformedStepsAreRefusedNamingTheVariable) {
  for (const char* bad : {"x", "3,0", "2.5", "-1"}) {
    ::setenv("TIDE_INJECT_NAN_AT", bad, 1);
    try {
      loss_tap_from_environment();
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("TIDE_INJECT_NAN_AT"), std::string::npos) << e.what();
    }
  }
  ::unsetenv("TIDE_INJECT_NAN_AT");
  EXPECT_FALSE(loss_tap_from_environment()) << "unset: no tap, every loss as computed";
}

TEST(Anomaly, NonFiniteLossSkipsTheUpdate) {
  const RunOutcome r = train(anomaly_run(8), "4");
  ASSERT_EQ(r.rows.size(), 8u);
  for (const auto& row : r.rows) {
    const bool bad = row["step"] == 4;
    EXPECT_EQ(row.value("skipped", false), bad) << row.dump();
    if (bad) {
      EXPECT_EQ(row["anomaly"], json({{"kind", "nonfinite"}, {"action", "skip"}}));
    }
  }
  ASSERT_EQ(r.anomalies.size(), 1u);
  EXPECT_EQ(r.anomalies[0]["kind"], "nonfinite");
  EXPECT_TRUE(std::isfinite(r.result.final_loss));
}

TEST(Anomaly, RollbackReloadsTheLatestCheckpointAndMovesTheDataOn) {
  RunConfig c = anomaly_run(8);
  c.checkpoint.every = 2;
  c.anomaly.on_nonfinite = AnomalyAction::Rollback;
  const RunOutcome r = train(c, "5");
  ASSERT_EQ(r.anomalies.size(), 1u);
  EXPECT_EQ(r.anomalies[0]["action"], "rollback");
  EXPECT_EQ(r.anomalies[0]["to_step"], 4);
  EXPECT_EQ(r.result.steps, 8);
  // Steps 1-5, then 5-8 again after going back to step 4.
  std::vector<int64_t> steps;
  for (const auto& row : r.rows) steps.push_back(row["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 5, 6, 7, 8}));
  // The replayed step 5 reads the next batch, not the one that failed: its loss differs
  // from the first step-5 row's (NaN) and from step 4's weights + step 5's batch.
  EXPECT_FALSE(r.rows[5].contains("anomaly"));
  EXPECT_TRUE(std::isfinite(r.rows[5]["loss"].get<double>()));
}

TEST(Anomaly, StopEndsTheRun) {
  RunConfig c = anomaly_run(8);
  c.anomaly.on_nonfinite = AnomalyAction::Stop;
  const RunOutcome r = train(c, "3");
  EXPECT_TRUE(r.result.stopped);
  EXPECT_EQ(r.result.steps, 3);
  EXPECT_EQ(r.rows.size(), 3u);
}

TEST(Anomaly, ALossSpikeScalesTheLearningRate) {
  // A learning rate of 5 from step 15 on wrecks the weights: step 16's loss spikes.
  RunConfig c = anomaly_run(18);
  c.anomaly.on_loss_spike = AnomalyAction::ScaleLr;
  c.anomaly.lr_factor = 0.1;
  TrainHooks hooks;
  hooks.controlled = true;
  auto calls = std::make_shared<int>(0);
  hooks.take_commands = [calls] {
    return (*calls)++ == 14 ? json::array({{{"op", "set"}, {"values", {{"optimizer.lr", 5.0}}}}}).dump() : "";
  };
  const RunOutcome r = train(c, "", hooks);
  ASSERT_FALSE(r.anomalies.empty());
  EXPECT_EQ(r.anomalies[0]["kind"], "loss_spike");
  EXPECT_EQ(r.anomalies[0]["step"], 16);
  EXPECT_GT(r.anomalies[0]["score"].get<double>(), c.anomaly.spike_z);
  EXPECT_EQ(r.anomalies[0]["action"], "scale_lr");
  // The next step runs at a tenth of the rate.
  EXPECT_DOUBLE_EQ(r.rows[16]["lr"].get<double>(), 0.5);
}

TEST(Anomaly, ThePolicyDecidesAndItsLrFactorApplies) {
  RunConfig c = anomaly_run(6);
  TrainHooks hooks;
  std::vector<json> asked;
  hooks.anomaly_policy = [&asked](const json& a) {
    asked.push_back(a);
    return json{{"action", "scale_lr"}, {"lr_factor", 0.25}};
  };
  const RunOutcome r = train(c, "3", hooks);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0]["step"], 3);
  EXPECT_EQ(asked[0]["kind"], "nonfinite");
  EXPECT_TRUE(asked[0]["value"].is_null());  // NaN has no JSON form
  EXPECT_EQ(asked[0]["action"], "skip");     // what the recipe declared
  ASSERT_EQ(r.anomalies.size(), 1u);
  EXPECT_EQ(r.anomalies[0]["action"], "scale_lr");
  EXPECT_EQ(r.anomalies[0]["by"], "on_anomaly");
  EXPECT_EQ(r.anomalies[0]["lr_factor"], 0.25);
  EXPECT_TRUE(r.rows[2]["skipped"].get<bool>());
  EXPECT_DOUBLE_EQ(r.rows[3]["lr"].get<double>(), 0.25 * r.rows[1]["lr"].get<double>());
}

TEST(Anomaly, APolicyThatFailsLeavesTheDeclaredAction) {
  RunConfig c = anomaly_run(5);
  TrainHooks hooks;
  hooks.anomaly_policy = [](const json&) -> json { throw std::runtime_error("no answer"); };
  const RunOutcome r = train(c, "2", hooks);
  ASSERT_EQ(r.anomalies.size(), 1u);
  EXPECT_EQ(r.anomalies[0]["action"], "skip");
  EXPECT_EQ(r.anomalies[0]["by"], "recipe");
  EXPECT_EQ(r.result.steps, 5);
}

TEST(Anomaly, WithAPolicyASpikeIsReportedEvenWhenDeclaredNone) {
  // A learning rate of 5 from step 15 on wrecks the weights; the recipe declares no
  // action for spikes, but its policy is asked and answers stop.
  RunConfig c = anomaly_run(18);
  TrainHooks hooks;
  hooks.controlled = true;
  auto calls = std::make_shared<int>(0);
  hooks.take_commands = [calls] {
    return (*calls)++ == 14 ? json::array({{{"op", "set"}, {"values", {{"optimizer.lr", 5.0}}}}}).dump() : "";
  };
  hooks.anomaly_policy = [](const json& a) { return a["kind"] == "loss_spike" ? json{{"action", "stop"}} : json(); };
  const RunOutcome r = train(c, "", hooks);
  ASSERT_FALSE(r.anomalies.empty());
  EXPECT_EQ(r.anomalies[0]["kind"], "loss_spike");
  EXPECT_EQ(r.anomalies[0]["action"], "stop");
  EXPECT_TRUE(r.result.stopped);
  EXPECT_EQ(r.result.steps, 16);
}

}  // namespace
}  // namespace tide
