// The recipe policies of the controller's runs (docs/recipes.md, "Policies"), each run's
// called by a PolicyRunner: on_step's commands go the way a client's requests would;
// on_anomaly answers a worker's question before the step's update is applied. A run's
// recipe is loaded on the evaluator's thread when the run is submitted or found
// unfinished at start, never on the controller's loop.
#pragma once

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "recipe_evaluator.h"
#include "run_book.h"
#include "tide/scripting/policy.h"

namespace tide::ipc {

class PolicyHost {
 public:
  // How a command of on_step's is carried out: as the client request it stands for,
  // with this request id; throws ProtocolError to refuse it.
  using Apply = std::function<void(RunRecord& r, const nlohmann::json& command, const std::string& request_id)>;
  PolicyHost(RunBook& runs, EventBus& bus, RecipeEvaluator& evaluator, Apply apply);

  // Starts loading the run's recipe for its policies.
  void load(const RunRecord& r);
  void forget(const std::string& run) { runs_.erase(run); }

  void on_step(RunRecord& r, const nlohmann::json& metrics);
  // The decision to send back (null: the declared action stands).
  nlohmann::json on_anomaly(RunRecord& r, const nlohmann::json& question);

 private:
  PolicyRunner* runner_of(RunRecord& r);

  struct Loading {
    std::shared_future<EvaluatedRecipe> recipe;
    bool ready = false;
    std::unique_ptr<PolicyRunner> runner;  // once ready; null: the recipe has no policies
  };
  RunBook& runs_book_;
  EventBus& bus_;
  RecipeEvaluator& evaluator_;
  Apply apply_;
  std::map<std::string, Loading> runs_;
};

}  // namespace tide::ipc
