#include "local_policies.h"

#include <mutex>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "tide/scripting/policy.h"

namespace tide::cli {

void run_policies_locally(TrainHooks& hooks, std::shared_ptr<Recipe> recipe, bool leader) {
  const bool on_anomaly = recipe->has_policy("on_anomaly"), on_step = recipe->has_policy("on_step");
  if (!on_anomaly && !on_step) return;
  auto policies = std::make_shared<RunPolicies>(recipe);
  if (on_anomaly)
    hooks.anomaly_policy = [policies](nlohmann::json anomaly) {
      auto answer = policies->on_anomaly(anomaly);
      if (!answer.error.empty()) spdlog::warn("{}", answer.error);
      return answer.value;
    };
  if (!on_step) return;
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
  hooks.on_step = [policies, queue, previous](const StepMetrics& m) {
    if (previous) previous(m);
    if (!policies->active("on_step")) return;
    const auto answer = policies->on_step(to_json(m));
    if (!answer.error.empty()) spdlog::warn("step {}: {}", m.step, answer.error);
    if (answer.value.empty()) return;
    spdlog::info("step {}: on_step answered {}", m.step, answer.value.dump());
    std::lock_guard<std::mutex> lock(queue->mu);
    for (const auto& c : answer.value) queue->commands.push_back(c);
  };
}

}  // namespace tide::cli
