#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tide/scripting/policy.h"
#include "tide/scripting/recipe.h"

namespace tide {
namespace {
using json = nlohmann::json;

std::shared_ptr<Recipe> recipe_with(const std::string& policies) {
  const std::string text = R"(return tide.recipe {
  name = "p",
  model = tide.models.llama { vocab_size = 300, dim = 64, n_layers = 2, n_heads = 4, max_seq_len = 64 },
  data = { path = "ds", seq_len = 64 },
  batch = { micro_batch = 2, global_batch = 8 },
  )" + policies + R"(
})";
  SandboxLimits limits;
  limits.call_instructions = 100'000;
  return std::make_shared<Recipe>(Recipe::load_string(text, "@p.lua", {}, limits));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const RecipeError& e) {
    return e.what();
  }
  return "";
}

TEST(Policies, TopLevelFunctionsAreKeptOutOfTheConfig) {
  auto r = recipe_with(R"(on_anomaly = function(a) return "skip" end,
  on_step = function(m) return nil end,)");
  EXPECT_TRUE(r->has_policy("on_anomaly"));
  EXPECT_TRUE(r->has_policy("on_step"));
  EXPECT_FALSE(r->has_policy("schedule.lr"));
  EXPECT_EQ(r->config().name, "p");
  EXPECT_FALSE(recipe_with("")->has_policy("on_step"));
}

TEST(Policies, APolicyThatIsNotAFunctionIsRefused) {
  const std::string e = error_of([] { recipe_with(R"(on_step = "checkpoint",)"); });
  EXPECT_NE(e.find("on_step: must be a function, got \"checkpoint\""), std::string::npos) << e;
  const std::string nested = error_of([] { recipe_with(R"(eval = { on_step = function() end },)"); });
  EXPECT_NE(nested.find("eval.on_step: is a function"), std::string::npos) << nested;
}

TEST(Policies, TheArgumentArrivesAsATableAndTheAnswerAsJson) {
  auto r = recipe_with(R"(on_step = function(m)
    return { seen = m.kind .. "@" .. m.step, double = m.values[2] * 2, none = m.missing }
  end,)");
  const json answer = r->call_policy("on_step", {{"kind", "loss_spike"}, {"step", 7}, {"values", {1.5, 2.5}}});
  EXPECT_EQ(answer, (json{{"seen", "loss_spike@7"}, {"double", 5}}));
}

TEST(Policies, StateKeptInLuaLastsAcrossCalls) {
  auto r = recipe_with(R"(on_step = (function()
    local calls = 0
    return function(m) calls = calls + 1; return calls end
  end)(),)");
  r->call_policy("on_step", json::object());
  EXPECT_EQ(r->call_policy("on_step", json::object()), 2);
}

TEST(Policies, AnomalyAnswers) {
  EXPECT_TRUE(anomaly_decision(nullptr).is_null());
  EXPECT_EQ(anomaly_decision("rollback"), (json{{"action", "rollback"}}));
  EXPECT_EQ(anomaly_decision({{"action", "scale_lr"}, {"lr_factor", 0.25}}),
            (json{{"action", "scale_lr"}, {"lr_factor", 0.25}}));
  std::string e = error_of([] { anomaly_decision("explode"); });
  EXPECT_NE(e.find("'explode' is not an action (none, skip, rollback, scale_lr, stop)"), std::string::npos) << e;
  e = error_of([] { anomaly_decision({{"action", "scale_lr"}, {"lr_factor", 2}}); });
  EXPECT_NE(e.find("lr_factor = 2"), std::string::npos) << e;
  e = error_of([] { anomaly_decision({{"actoin", "skip"}}); });
  EXPECT_NE(e.find("'actoin'"), std::string::npos) << e;
  e = error_of([] { anomaly_decision(3); });
  EXPECT_NE(e.find("answered 3"), std::string::npos) << e;
}

TEST(Policies, StepAnswersBecomeLiveControlCommands) {
  EXPECT_EQ(step_commands(nullptr), json::array());
  const json commands = step_commands(
      {{"stop", true}, {"checkpoint", true}, {"pause", false}, {"set", {{"optimizer", {{"lr_scale", 0.5}}}, {"eval.every", 10}}}});
  EXPECT_EQ(commands, json::parse(R"([{"op": "set", "values": {"optimizer.lr_scale": 0.5, "eval.every": 10}},
                                      {"op": "checkpoint"}, {"op": "stop"}])"));
  std::string e = error_of([] { step_commands({{"rollback", true}}); });
  EXPECT_NE(e.find("'rollback'"), std::string::npos) << e;
  e = error_of([] { step_commands({{"checkpoint", "yes"}}); });
  EXPECT_NE(e.find("checkpoint = \"yes\""), std::string::npos) << e;
  e = error_of([] { step_commands("stop"); });
  EXPECT_NE(e.find("answered \"stop\""), std::string::npos) << e;
}

TEST(Policies, AFailingPolicyIsReportedOnceAndSwitchedOff) {
  RunPolicies p(recipe_with(R"(on_step = function(m) while true do end end,
  on_anomaly = function(a) return a.count == 1 and "skip" or "everything" end,)"));
  auto step = p.on_step({{"step", 1}});
  EXPECT_TRUE(step.value.is_null());
  EXPECT_NE(step.error.find("instruction budget exhausted"), std::string::npos) << step.error;
  EXPECT_NE(step.error.find("on_step (defined at p.lua:6)"), std::string::npos) << step.error;
  EXPECT_NE(step.error.find("switched off"), std::string::npos) << step.error;
  EXPECT_FALSE(p.active("on_step"));
  EXPECT_EQ(p.on_step({{"step", 2}}).value, json::array());  // no second budget spent

  json first = {{"kind", "nonfinite"}}, second_anomaly = first;
  EXPECT_EQ(p.on_anomaly(first).value, (json{{"action", "skip"}}));
  EXPECT_EQ(first["count"], 1);
  const auto second = p.on_anomaly(second_anomaly);
  EXPECT_EQ(second_anomaly["count"], 2);
  EXPECT_NE(second.error.find("'everything' is not an action"), std::string::npos) << second.error;
  EXPECT_FALSE(p.active("on_anomaly"));
}

}  // namespace
}  // namespace tide
