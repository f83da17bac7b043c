// The recipe policies of the controller's runs (docs/recipes.md, "Policies"): on_step
// answers with live-control commands that go the way a client's would; on_anomaly
// answers a worker's question before the step's update is applied.
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "controller_impl.h"
#include "tide/scripting/recipe.h"

namespace tide::ipc {
namespace fs = std::filesystem;

namespace {
// The controller's loop serves every client and run: a policy call gets a short budget.
SandboxLimits policy_limits() {
  SandboxLimits l;
  l.seconds = 3.0;
  l.call_instructions = 1'000'000;
  l.call_seconds = 0.05;
  return l;
}
}  // namespace

RunPolicies* Controller::Impl::policies_of(const RunRecord& r) {
  if (auto it = policies.find(r.id); it != policies.end()) return it->second.get();
  std::unique_ptr<RunPolicies> loaded;
  try {
    auto recipe = std::make_shared<Recipe>(
        Recipe::load_file((fs::path(registry->run_dir(r.id)) / "recipe.lua").string(), r.overrides, policy_limits()));
    if (recipe->has_policy("on_anomaly") || recipe->has_policy("on_step")) {
      recipe->on_print([this, run = r.id](const std::string& line) { run_log(run, spdlog::level::info, "print: " + line); });
      loaded = std::make_unique<RunPolicies>(std::move(recipe));
    }
  } catch (const std::exception& e) {
    // It loaded at submit; a state directory edited since is the only way here.
    spdlog::error("run {}: cannot load its recipe's policies: {}", r.id, e.what());
  }
  return (policies[r.id] = std::move(loaded)).get();
}

void Controller::Impl::step_policy(RunRecord& r, const json& metrics) {
  RunPolicies* p = policies_of(r);
  if (!p || !p->active("on_step")) return;
  const auto answer = p->on_step(metrics);
  const int64_t step = metrics.value("step", int64_t{0});
  if (!answer.error.empty()) {
    run_log(r.id, spdlog::level::warn, fmt::format("step {}: {}", step, answer.error));
    publish(r.id, "policy", {{"policy", "on_step"}, {"step", step}, {"error", answer.error}});
    return;
  }
  if (answer.value.empty()) return;
  // Applied as a client's request would be: checked, recorded (a `set` survives a
  // restart), delivered to rank 0; a refusal is reported, not fatal.
  const std::string id = fmt::format("on_step@{}", step);
  json results = json::array();
  for (const auto& command : answer.value) {
    const std::string op = command["op"].get<std::string>();
    json result = {{"op", op}};
    try {
      if (op == "set")
        set({{"run", r.id}, {"values", command["values"]}}, id);
      else
        control(op, {{"run", r.id}}, id);
      result["ok"] = true;
    } catch (const ProtocolError& e) {
      result["ok"] = false;
      result["error"] = e.what();
    }
    results.push_back(result);
  }
  publish(r.id, "policy", {{"policy", "on_step"}, {"step", step}, {"commands", answer.value}, {"results", results}});
}

void Controller::Impl::anomaly_policy(RunRecord& r, const std::string& worker, const json& question) {
  RunPolicies* p = policies_of(r);
  json anomaly = question.value("anomaly", json::object());
  // Asked after the policy was switched off, the declared action stands, unreported.
  const bool asked = p && p->active("on_anomaly");
  RunPolicies::Answer answer;
  if (asked) answer = p->on_anomaly(anomaly);
  json body = {{"policy", "on_anomaly"}, {"step", anomaly.value("step", int64_t{0})}, {"anomaly", anomaly}};
  body["decision"] = answer.value;
  if (!answer.error.empty()) {
    run_log(r.id, spdlog::level::warn, answer.error);
    body["error"] = answer.error;
  }
  const std::string text = json{{"type", "answer"}, {"query", question.value("query", int64_t{0})}, {"body", answer.value}}.dump();
  (void)workers.send(zmq::buffer(worker), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)workers.send(zmq::buffer(text), zmq::send_flags::dontwait);
  if (asked) publish(r.id, "policy", std::move(body));
}

}  // namespace tide::ipc
