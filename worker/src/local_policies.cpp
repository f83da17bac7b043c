#include "local_policies.h"

#include <mutex>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "tide/scripting/policy.h"

namespace tide::worker {

void run_policies_locally(TrainHooks& hooks, std::shared_ptr<Recipe> recipe, bool leader) {
  // What a controller publishes as a policy event, a run without one logs.
  PolicyRunner::Report report{[](const std::string& line) { spdlog::warn("{}", line); },
                              [](const nlohmann::json& body) { spdlog::info("policy: {}", body.dump()); }};
  std::shared_ptr<PolicyRunner> runner = PolicyRunner::for_recipe(recipe, std::move(report));
  if (!runner) return;
  if (recipe->has_policy("on_anomaly"))
    hooks.anomaly_policy = [runner](nlohmann::json anomaly) { return runner->anomaly(std::move(anomaly)); };
  if (!recipe->has_policy("on_step")) return;
  // The commands wait for the next boundary's live control, as a controller's would.
  hooks.controlled = true;
  if (!leader) return;
  struct Queue {
    std::mutex mu;
    nlohmann::json commands = nlohmann::json::array();
  };
  auto queue = std::make_shared<Queue>();
  hooks.take_commands = [queue] {
    std::lock_guard<std::mutex> lock(queue->mu);
    if (queue->commands.empty()) return std::string();
    const std::string text = queue->commands.dump();
    queue->commands = nlohmann::json::array();
    return text;
  };
  auto previous = hooks.on_step;
  hooks.on_step = [runner, queue, previous](const StepMetrics& m) {
    if (previous) previous(m);
    runner->step(to_json(m), [&queue](const nlohmann::json& command) {
      std::lock_guard<std::mutex> lock(queue->mu);
      queue->commands.push_back(command);
    });
  };
}

}  // namespace tide::worker
