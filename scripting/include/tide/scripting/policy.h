// What a recipe's policies answer, turned into what the trainer and the controller act
// on. The functions are called by a controller (tided, an embedded engine) or, for a
// run without one, by rank 0 of the job; docs/recipes.md, "Policies", is the contract.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace tide {

class Recipe;

// on_anomaly(a), a = {step, kind, value, score, action (the declared one), count}, may
// answer nil (the declared action stands), an action name ("none", "skip", "rollback",
// "scale_lr", "stop") or {action = name, lr_factor = x}. Returns {"action": name} plus
// "lr_factor" when given, or null for nil. Throws RecipeError naming the bad answer.
nlohmann::json anomaly_decision(const nlohmann::json& answer);

// on_step(m), m = the step's metrics row, may answer nil or a table of commands:
//   { set = { ["optimizer.lr_scale"] = 0.5 }   -- or nested: { optimizer = { lr_scale = 0.5 } }
//     checkpoint = true, pause = true, stop = true }
// Returns the live-control commands ([{"op": "set", "values": {...}}, {"op":
// "checkpoint"}, ...]; docs/protocol.md, worker link) in the order set, checkpoint,
// pause, stop: an empty array for nil. Throws RecipeError naming the bad answer.
nlohmann::json step_commands(const nlohmann::json& answer);

// A run's policies, held by whoever calls them for the run (its controller, or rank 0).
// Each call runs under the recipe's per-call budget. A policy that fails (a Lua error,
// the budget, an answer that is not one of the above) is switched off for the rest of
// the run: a broken policy costs one budget, not one per step, and the recipe's
// declared behaviour applies from then on.
class RunPolicies {
 public:
  explicit RunPolicies(std::shared_ptr<Recipe> recipe);

  // "on_anomaly", "on_step": defined by the recipe and not switched off.
  bool active(const std::string& name) const;

  struct Answer {
    nlohmann::json value;  // anomaly_decision's or step_commands' result
    std::string error;     // why the policy failed and was switched off; value is then null
  };
  // `anomaly` as decide_anomaly sends it; "count" (this one included) is added to it.
  Answer on_anomaly(nlohmann::json& anomaly);
  Answer on_step(const nlohmann::json& metrics);

 private:
  Answer call(const std::string& name, const nlohmann::json& arg);

  std::shared_ptr<Recipe> recipe_;
  std::set<std::string> off_;
  int64_t anomalies_ = 0;
};

// The one runner of a run's policies, for a controller's runs and for a run without one
// (rank 0 of `tide train`): it calls a policy, hands each command on_step answered to
// the caller's `apply`, and reports what the policy answered and what came of it. Where
// the commands go and where reports are seen is the caller's.
class PolicyRunner {
 public:
  struct Report {
    // Why a policy failed (it is switched off from then on), for the run's log.
    std::function<void(const std::string& line)> warn;
    // The "policy" event body (docs/protocol.md, Events): {policy, step, commands,
    // results} for on_step, {policy, step, anomaly, decision[, error]} for on_anomaly.
    std::function<void(nlohmann::json body)> event;
  };
  // Null when the recipe defines neither on_step nor on_anomaly.
  static std::unique_ptr<PolicyRunner> for_recipe(std::shared_ptr<Recipe> recipe, Report report);

  bool active(const std::string& name) const { return policies_.active(name); }
  // on_step(metrics); each command in turn to apply(command), which throws to refuse it
  // (the refusal is reported in the command's result, and the next command goes on).
  void step(const nlohmann::json& metrics, const std::function<void(const nlohmann::json& command)>& apply);
  // The decision on an anomaly as decide_anomaly asks it (null: the declared action).
  nlohmann::json anomaly(nlohmann::json anomaly);

 private:
  PolicyRunner(std::shared_ptr<Recipe> recipe, Report report);

  RunPolicies policies_;
  Report report_;
};

}  // namespace tide
