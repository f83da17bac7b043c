// Runs: plan, submit, status, list, wait, control, set, metrics.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "engine.h"
#include "tide/engine/io/json_input.h"
#include "tide/ipc/run_registry.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using tide::capi::Failure;
using tide::capi::require;
using tide::capi::require_text;

namespace {
static_assert(static_cast<int>(tide::ipc::RunState::queued) + 1 == TIDE_RUN_QUEUED &&
                  static_cast<int>(tide::ipc::RunState::restarting) + 1 == TIDE_RUN_RESTARTING &&
                  static_cast<int>(tide::ipc::RunState::cancelled) + 1 == TIDE_RUN_CANCELLED,
              "TIDE_RUN_* follow ipc::RunState");

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Failure(TIDE_ERR_IO, fmt::format("cannot read recipe_file '{}'", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

template <size_t N>
void copy_text(char (&out)[N], const std::string& text) {
  std::snprintf(out, N, "%s", text.c_str());
}

double number_or_nan(const json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_number() ? object[key].get<double>()
                                                                                : std::numeric_limits<double>::quiet_NaN();
}

// The recipe fields of a submit or plan request: exactly one source, and the overrides.
template <class Options>
json recipe_fields(const Options& options) {
  const int sources =
      (options.recipe_text != nullptr) + (options.recipe_file != nullptr) + (options.recipe_name != nullptr);
  if (sources != 1)
    throw Failure(TIDE_ERR_INVALID_ARGUMENT,
                  fmt::format("give exactly one of recipe_text, recipe_file and recipe_name (got {})", sources));
  if (options.overrides_count > 0) require(options.overrides, "options->overrides");
  json body = json::object();
  if (options.recipe_name) {
    require_text(options.recipe_name, "options->recipe_name");
    body["recipe_name"] = options.recipe_name;
  } else {
    body["recipe"] = options.recipe_text ? std::string(options.recipe_text) : read_file(options.recipe_file);
  }
  json overrides = json::array();
  for (size_t i = 0; i < options.overrides_count; ++i) {
    if (!options.overrides[i])
      throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("options->overrides[{}] is NULL", i));
    overrides.push_back(options.overrides[i]);
  }
  body["overrides"] = overrides;
  return body;
}

int state_code(const std::string& name) {
  const auto s = tide::ipc::state_from_name(name);
  return s ? static_cast<int>(*s) + 1 : 0;
}

// A call on one run: engine and run id checked.
template <class F>
int on_run(const char* function, tide_engine* engine, const char* run_id, F&& body) {
  return tide::capi::guarded(function, [&] {
    auto e = tide::capi::engines().get(engine, "engine");
    require_text(run_id, "run_id");
    return body(*e, json{{"run", run_id}});
  });
}

int control(const char* function, const char* op, tide_engine* engine, const char* run_id) {
  return on_run(function, engine, run_id, [&](tide_engine& e, const json& body) {
    e.request(op, body);
    return TIDE_OK;
  });
}
}  // namespace

extern "C" {

void tide_submit_options_init(tide_submit_options* options) {
  const tide_submit_options defaults = TIDE_SUBMIT_OPTIONS_INIT;
  if (options) *options = defaults;
}

const char* tide_run_state_name(int state) {
  if (state < TIDE_RUN_QUEUED || state > TIDE_RUN_CANCELLED) return "unknown";
  return tide::ipc::state_name(static_cast<tide::ipc::RunState>(state - 1));
}

int tide_run_submit(tide_engine* engine, const tide_submit_options* options, char** run_id_out) {
  return tide::capi::guarded("tide_run_submit", [&] {
    auto e = tide::capi::engines().get(engine, "engine");
    require(options, "options");
    require(run_id_out, "run_id_out");
    *run_id_out = nullptr;
    tide::capi::require_version(options->version, TIDE_SUBMIT_OPTIONS_VERSION, "options");
    json body = recipe_fields(*options);
    if (options->workers != 0) body["workers"] = options->workers;
    body["priority"] = options->priority;
    if (options->idempotency_key) body["idempotency_key"] = options->idempotency_key;
    body["workdir"] = options->workdir ? fs::absolute(options->workdir).string() : fs::current_path().string();
    const json reply = e->request("submit", body);
    *run_id_out = tide::capi::duplicate(reply.at("run").at("id").get<std::string>());
    return TIDE_OK;
  });
}

void tide_plan_options_init(tide_plan_options* options) {
  const tide_plan_options defaults = TIDE_PLAN_OPTIONS_INIT;
  if (options) *options = defaults;
}

int tide_engine_plan(tide_engine* engine, const tide_plan_options* options, char** plan_json_out) {
  return tide::capi::guarded("tide_engine_plan", [&] {
    auto e = tide::capi::engines().get(engine, "engine");
    require(options, "options");
    require(plan_json_out, "plan_json_out");
    *plan_json_out = nullptr;
    tide::capi::require_version(options->version, TIDE_PLAN_OPTIONS_VERSION, "options");
    json body = recipe_fields(*options);
    for (const auto& [value, name] : {std::pair{options->nodes, "options->nodes"},
                                      {options->devices_per_node, "options->devices_per_node"},
                                      {options->top, "options->top"}})
      if (value < 0)
        throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("{} is {}: 0 (the default) or more", name, value));
    json cluster = {{"device", options->device ? options->device : "cpu"},
                    {"nodes", options->nodes > 0 ? options->nodes : 1},
                    {"devices_per_node", options->devices_per_node > 0 ? options->devices_per_node : 1}};
    body["cluster"] = std::move(cluster);
    if (options->top > 0) body["top"] = options->top;
    const json reply = e->request("plan", body);
    *plan_json_out = tide::capi::duplicate(reply.at("plan").dump());
    return TIDE_OK;
  });
}

int tide_run_status_get(tide_engine* engine, const char* run_id, tide_run_status* status) {
  return on_run("tide_run_status_get", engine, run_id, [&](tide_engine& e, const json& body) {
    require(status, "status");
    tide::capi::require_version(status->version, TIDE_RUN_STATUS_VERSION, "status");
    const json r = e.request("status", body).at("run");
    const uint32_t version = status->version;
    *status = tide_run_status{};
    status->version = version;
    copy_text(status->id, r.value("id", ""));
    copy_text(status->name, r.value("name", ""));
    status->state = state_code(r.value("state", ""));
    status->workers = r.value("workers", 1);
    status->last_step = r.value("last_step", int64_t{0});
    status->total_steps = r.value("total_steps", int64_t{0});
    status->attempt = r.value("attempt", int64_t{0});
    status->restarts = r.value("restarts", int64_t{0});
    const json m = r.value("metrics", json::object());
    status->loss = number_or_nan(m, "loss");
    status->lr = number_or_nan(m, "lr");
    status->tokens_per_second = number_or_nan(m, "tokens_per_second");
    status->final_loss = number_or_nan(r, "final_loss");
    copy_text(status->run_dir, r.value("run_dir", ""));
    copy_text(status->error, r.value("error", ""));
    return TIDE_OK;
  });
}

int tide_run_list(tide_engine* engine, char** json_out) {
  return tide::capi::guarded("tide_run_list", [&] {
    auto e = tide::capi::engines().get(engine, "engine");
    require(json_out, "json_out");
    *json_out = nullptr;
    *json_out = tide::capi::duplicate(e->request("list").at("runs").dump());
    return TIDE_OK;
  });
}

int tide_run_wait(tide_engine* engine, const char* run_id, uint32_t state_mask, int32_t timeout_ms,
                  int32_t* state_out) {
  return on_run("tide_run_wait", engine, run_id, [&](tide_engine& e, const json& body) {
    if (state_mask == 0) throw Failure(TIDE_ERR_INVALID_ARGUMENT, "state_mask is 0: no state to wait for");
    if (timeout_ms < -1) throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("timeout_ms {} < -1", timeout_ms));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      const int state = state_code(e.request("status", body).at("run").value("state", ""));
      if (state > 0 && (state_mask & TIDE_RUN_STATE_BIT(state))) {
        if (state_out) *state_out = state;
        return TIDE_OK;
      }
      if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline)
        throw Failure(TIDE_ERR_TIMEOUT, fmt::format("run {} is still {} after {} ms", run_id,
                                                    tide_run_state_name(state), timeout_ms));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

int tide_run_pause(tide_engine* engine, const char* run_id) { return control("tide_run_pause", "pause", engine, run_id); }
int tide_run_resume(tide_engine* engine, const char* run_id) {
  return control("tide_run_resume", "resume", engine, run_id);
}
int tide_run_stop(tide_engine* engine, const char* run_id) { return control("tide_run_stop", "stop", engine, run_id); }
int tide_run_cancel(tide_engine* engine, const char* run_id) {
  return control("tide_run_cancel", "cancel", engine, run_id);
}
int tide_run_checkpoint(tide_engine* engine, const char* run_id) {
  return control("tide_run_checkpoint", "checkpoint", engine, run_id);
}

int tide_run_set(tide_engine* engine, const char* run_id, const char* field, const char* value) {
  return on_run("tide_run_set", engine, run_id, [&](tide_engine& e, json body) {
    require_text(field, "field");
    require(value, "value");
    json parsed = tide::parse_json_or_discard(value);
    if (parsed.is_discarded()) parsed = value;  // as tide set: not JSON, so a string
    body["values"] = {{field, parsed}};
    e.request("set", body);
    return TIDE_OK;
  });
}

int tide_run_metrics(tide_engine* engine, const char* run_id, int64_t since_step, char** json_out) {
  return on_run("tide_run_metrics", engine, run_id, [&](tide_engine& e, json body) {
    require(json_out, "json_out");
    *json_out = nullptr;
    if (since_step < 0) throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("since_step {} < 0", since_step));
    body["since_step"] = since_step;
    body["limit"] = 100000;
    *json_out = tide::capi::duplicate(e.request("metrics", body).at("metrics").dump());
    return TIDE_OK;
  });
}

}  // extern "C"
