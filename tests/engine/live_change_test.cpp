#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/live_change.h"
#include "tide/engine/run_layout.h"

namespace tide {
namespace {
using json = nlohmann::json;

RunConfig two_way_data_parallel() {
  RunConfig c;
  c.parallel.dp = 2;
  c.batch.micro_batch = 2;
  c.batch.global_batch = 8;
  return c;
}

// The field a refusal names, or "" when the change is accepted.
std::string refused_field(const RunConfig& c, const json& values, const BatchLayout& started) {
  try {
    check_live_change(c, values, started);
    return "";
  } catch (const ConfigError& e) {
    return e.field();
  }
}

TEST(BatchLayout, FixesTheMicroBatchAndDerivesTheAccumulation) {
  RunConfig c = two_way_data_parallel();
  const BatchLayout b = batch_layout(c, 2);
  EXPECT_EQ(b.dp, 2);
  EXPECT_EQ(b.micro_batch, 2);
  EXPECT_EQ(accumulation_steps(8, b), 2);
  EXPECT_EQ(accumulation_steps(12, b), 3);
  EXPECT_NO_THROW(check_global_batch(12, b));
  EXPECT_THROW(check_global_batch(10, b), ConfigError);  // 10 sequences do not split into 2 x 2
  // parallel.micro_batches derives the micro-batch from the batch the job starts with.
  c.parallel.micro_batches = 4;
  c.batch.global_batch = 16;
  EXPECT_EQ(batch_layout(c, 2).micro_batch, 2);
}

TEST(LiveChange, AcceptsALiveFieldAndSaysItsEffect) {
  const RunConfig c = two_way_data_parallel();
  const LiveChange change =
      check_live_change(c, json{{"optimizer.weight_decay", 0.5}, {"log_level", "debug"}}, batch_layout(c, 2));
  EXPECT_EQ(change.next.optimizer.weight_decay, 0.5);
  EXPECT_EQ(change.next.log_level, "debug");
  EXPECT_EQ(c.optimizer.weight_decay, RunConfig().optimizer.weight_decay) << "the current configuration is kept";
  ASSERT_EQ(change.fields.size(), 2u);
  for (const auto& f : change.fields)
    EXPECT_EQ(f.effect, f.path == "log_level" ? LiveEffect::LogLevel : LiveEffect::Optimizer) << f.path;
}

TEST(LiveChange, RefusesNamingTheField) {
  const RunConfig c = two_way_data_parallel();
  const BatchLayout started = batch_layout(c, 2);
  EXPECT_EQ(refused_field(c, json{{"model.dim", 128}}, started), "model.dim");           // not live
  EXPECT_EQ(refused_field(c, json{{"no.such", 1}}, started), "no.such");                 // not a field
  EXPECT_EQ(refused_field(c, json{{"optimizer.lr", 100}}, started), "optimizer.lr");     // out of range
  EXPECT_EQ(refused_field(c, json{{"batch.global_batch", 6}}, started), "batch.global_batch");  // 6 / (2 x 2)
  EXPECT_EQ(refused_field(c, json{{"batch.global_batch", 12}}, started), "");
  // A micro-batch fixed at start decides, not the one the new batch would derive.
  RunConfig derived = c;
  derived.parallel.micro_batches = 2;
  derived.batch.global_batch = 16;  // micro-batches of 16 / (2 x 2) = 4
  const BatchLayout derived_start = batch_layout(derived, 2);
  EXPECT_EQ(refused_field(derived, json{{"batch.global_batch", 12}}, derived_start), "batch.global_batch");
  EXPECT_EQ(refused_field(derived, json{{"batch.global_batch", 24}}, derived_start), "");
  // All or nothing: one bad field refuses the others too.
  EXPECT_EQ(refused_field(c, json{{"optimizer.grad_clip", 2.0}, {"model.dim", 128}}, started), "model.dim");
  EXPECT_THROW(check_live_change(c, json::object(), started), ConfigError);
  EXPECT_THROW(check_live_change(c, json::array(), started), ConfigError);
}

TEST(LiveChange, RefusesAPeakRateTheScheduleDoesNotUse) {
  RunConfig c = two_way_data_parallel();
  c.schedule.decay = DecayKind::Lua;  // schedule.lr is a function of the step
  const BatchLayout started = batch_layout(c, 2);
  try {
    check_live_change(c, json{{"optimizer.lr", 1e-4}}, started);
    FAIL() << "a live optimizer.lr would be ignored";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "optimizer.lr");
    EXPECT_NE(std::string(e.what()).find("schedule.lr"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("optimizer.lr_scale"), std::string::npos) << e.what();
  }
  EXPECT_EQ(refused_field(c, json{{"optimizer.lr_scale", 0.5}}, started), "");
}

}  // namespace
}  // namespace tide
