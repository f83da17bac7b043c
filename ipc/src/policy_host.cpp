#include "policy_host.h"

#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tide/scripting/recipe.h"

namespace tide::ipc {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// A policy call holds up the run that asked (on_anomaly) or the controller's loop
// (on_step): a short budget.
SandboxLimits policy_limits() {
  SandboxLimits l;
  l.seconds = 3.0;
  l.call_instructions = 1'000'000;
  l.call_seconds = 0.05;
  return l;
}
}  // namespace

PolicyHost::PolicyHost(RunBook& runs, EventBus& bus, RecipeEvaluator& evaluator, Apply apply)
    : runs_book_(runs), bus_(bus), evaluator_(evaluator), apply_(std::move(apply)) {}

void PolicyHost::load(const RunRecord& r) {
  const std::string path = (fs::path(runs_book_.registry().run_dir(r.id)) / "recipe.lua").string();
  Loading& l = runs_[r.id];
  l = Loading{};
  l.recipe =
      evaluator_.post([path, overrides = r.overrides] { return Recipe::load_file(path, overrides, policy_limits()); });
}

PolicyRunner* PolicyHost::runner_of(RunRecord& r) {
  auto it = runs_.find(r.id);
  if (it == runs_.end()) {
    load(r);
    it = runs_.find(r.id);
  }
  Loading& l = it->second;
  if (l.ready) return l.runner.get();
  // Loading started at submit or at the controller's start; a worker reports its first
  // step seconds later, so this wait is there for the odd case, not the rule.
  const EvaluatedRecipe& loaded = l.recipe.get();
  l.ready = true;
  if (!loaded.recipe) {
    // It loaded at submit; a state directory edited since is the only way here.
    spdlog::error("run {}: cannot load its recipe's policies: {}", r.id, loaded.error);
    return nullptr;
  }
  const std::string run = r.id;
  loaded.recipe->on_print(
      [this, run](const std::string& line) { runs_book_.log(run, spdlog::level::info, "print: " + line); });
  PolicyRunner::Report report{[this, run](const std::string& line) { runs_book_.log(run, spdlog::level::warn, line); },
                              [this, run](json body) { bus_.publish(run, "policy", std::move(body)); }};
  l.runner = PolicyRunner::for_recipe(loaded.recipe, std::move(report));
  return l.runner.get();
}

void PolicyHost::on_step(RunRecord& r, const json& metrics) {
  PolicyRunner* runner = runner_of(r);
  if (!runner) return;
  // Applied as a client's request would be: checked, recorded (a `set` survives a
  // restart), delivered to rank 0; a refusal is reported, not fatal.
  const std::string id = fmt::format("on_step@{}", metrics.value("step", int64_t{0}));
  runner->step(metrics, [&](const json& command) { apply_(r, command, id); });
}

json PolicyHost::on_anomaly(RunRecord& r, const json& question) {
  PolicyRunner* runner = runner_of(r);
  return runner ? runner->anomaly(question.value("anomaly", json::object())) : json(nullptr);
}

}  // namespace tide::ipc
