#include "tide/scripting/policy.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/engine/config_schema.h"
#include "tide/scripting/recipe.h"

namespace tide {
using json = nlohmann::json;

namespace {

// { optimizer = { lr_scale = 0.5 } } and { ["optimizer.lr_scale"] = 0.5 } alike become
// {"optimizer.lr_scale": 0.5}.
void flatten(const json& node, const std::string& prefix, json& out) {
  for (const auto& [key, value] : node.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object())
      flatten(value, path, out);
    else
      out[path] = value;
  }
}

bool flag(const json& answer, const char* key) {
  if (!answer.contains(key)) return false;
  const json& v = answer[key];
  if (!v.is_boolean())
    throw RecipeError(fmt::format("on_step answered {} = {}; it must be true or false", key, v.dump()));
  return v.get<bool>();
}

}  // namespace

json anomaly_decision(const json& answer) {
  if (answer.is_null()) return nullptr;
  json name = answer;
  json decision = json::object();
  if (answer.is_object()) {
    for (const auto& [key, value] : answer.items())
      if (key != "action" && key != "lr_factor")
        throw RecipeError(fmt::format("on_anomaly answered a table with '{}'; it may hold action and lr_factor", key));
    name = answer.value("action", json());
    if (answer.contains("lr_factor")) {
      const json& f = answer["lr_factor"];
      if (!f.is_number() || !(f.get<double>() > 0) || !(f.get<double>() <= 1))
        throw RecipeError(fmt::format("on_anomaly answered lr_factor = {}; it must be a number in (0, 1]", f.dump()));
      decision["lr_factor"] = f.get<double>();
    }
  }
  if (!name.is_string())
    throw RecipeError(fmt::format("on_anomaly answered {}; it must answer nil, an action name or {{action = name, "
                                  "lr_factor = x}}",
                                  answer.dump()));
  try {
    decision["action"] = anomaly_action_name(parse_anomaly_action(name.get<std::string>(), "on_anomaly"));
  } catch (const ConfigError& e) {
    throw RecipeError(fmt::format("on_anomaly answered {}", e.what()));
  }
  return decision;
}

json step_commands(const json& answer) {
  json commands = json::array();
  if (answer.is_null()) return commands;
  if (!answer.is_object())
    throw RecipeError(fmt::format("on_step answered {}; it must answer nil or a table such as {{set = {{...}}, "
                                  "checkpoint = true}}",
                                  answer.dump()));
  for (const auto& [key, value] : answer.items())
    if (key != "set" && key != "checkpoint" && key != "pause" && key != "stop")
      throw RecipeError(
          fmt::format("on_step answered a table with '{}'; it may hold set, checkpoint, pause and stop", key));
  if (answer.contains("set")) {
    if (!answer["set"].is_object() || answer["set"].empty())
      throw RecipeError(fmt::format("on_step answered set = {}; it must be a table of field = value",
                                    answer["set"].dump()));
    json values = json::object();
    flatten(answer["set"], "", values);
    commands.push_back({{"op", "set"}, {"values", values}});
  }
  for (const char* op : {"checkpoint", "pause", "stop"})
    if (flag(answer, op)) commands.push_back({{"op", op}});
  return commands;
}

RunPolicies::RunPolicies(std::shared_ptr<Recipe> recipe) : recipe_(std::move(recipe)) {}

bool RunPolicies::active(const std::string& name) const {
  return recipe_ && recipe_->has_policy(name) && off_.count(name) == 0;
}

RunPolicies::Answer RunPolicies::call(const std::string& name, const json& arg) {
  Answer out;
  try {
    const json answer = recipe_->call_policy(name, arg);
    out.value = name == "on_anomaly" ? anomaly_decision(answer) : step_commands(answer);
  } catch (const RecipeError& e) {
    off_.insert(name);
    out.value = nullptr;
    out.error = fmt::format("{}; {} is switched off for the rest of the run", e.what(), name);
  }
  return out;
}

RunPolicies::Answer RunPolicies::on_anomaly(json& anomaly) {
  if (!active("on_anomaly")) return {};
  anomaly["count"] = ++anomalies_;
  return call("on_anomaly", anomaly);
}

RunPolicies::Answer RunPolicies::on_step(const json& metrics) {
  if (!active("on_step")) return {json::array(), ""};
  return call("on_step", metrics);
}

std::unique_ptr<PolicyRunner> PolicyRunner::for_recipe(std::shared_ptr<Recipe> recipe, Report report) {
  if (!recipe->has_policy("on_anomaly") && !recipe->has_policy("on_step")) return nullptr;
  return std::unique_ptr<PolicyRunner>(new PolicyRunner(std::move(recipe), std::move(report)));
}

PolicyRunner::PolicyRunner(std::shared_ptr<Recipe> recipe, Report report)
    : policies_(std::move(recipe)), report_(std::move(report)) {}

void PolicyRunner::step(const json& metrics, const std::function<void(const json& command)>& apply) {
  if (!policies_.active("on_step")) return;
  const auto answer = policies_.on_step(metrics);
  const int64_t step = metrics.value("step", int64_t{0});
  if (!answer.error.empty()) {
    report_.warn(fmt::format("step {}: {}", step, answer.error));
    report_.event({{"policy", "on_step"}, {"step", step}, {"error", answer.error}});
    return;
  }
  if (answer.value.empty()) return;
  json results = json::array();
  for (const auto& command : answer.value) {
    json result = {{"op", command["op"]}};
    try {
      apply(command);
      result["ok"] = true;
    } catch (const std::exception& e) {
      result["ok"] = false;
      result["error"] = e.what();
    }
    results.push_back(result);
  }
  report_.event({{"policy", "on_step"}, {"step", step}, {"commands", answer.value}, {"results", results}});
}

json PolicyRunner::anomaly(json anomaly) {
  // Asked after the policy was switched off, the declared action stands, unreported.
  if (!policies_.active("on_anomaly")) return nullptr;
  const auto answer = policies_.on_anomaly(anomaly);
  json body = {{"policy", "on_anomaly"}, {"step", anomaly.value("step", int64_t{0})}, {"anomaly", anomaly}};
  body["decision"] = answer.value;
  if (!answer.error.empty()) {
    report_.warn(answer.error);
    body["error"] = answer.error;
  }
  report_.event(std::move(body));
  return answer.value;
}

}  // namespace tide
