#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "controller_impl.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/live_change.h"
#include "tide/engine/run_layout.h"
#include "tide/scripting/recipe.h"

namespace tide::ipc {
namespace fs = std::filesystem;

namespace {
std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A recipe submitted to a daemon gets less time than one run by hand: the controller
// serves everyone else while it loads.
SandboxLimits submit_limits() {
  SandboxLimits l;
  l.seconds = 3.0;
  return l;
}

std::vector<std::string> submitted_overrides(const json& b) {
  std::vector<std::string> overrides;
  if (!b.contains("overrides")) return overrides;
  for (const auto& item : require(b, "overrides", json::value_t::array)) {
    if (!item.is_string()) throw ProtocolError(ErrorCode::bad_request, "'overrides' holds a non-string");
    overrides.push_back(item.get<std::string>());
  }
  return overrides;
}

// A submit's recipe text and where it came from ("inline", or a bundled recipe's file).
std::pair<std::string, std::string> submitted_recipe(const json& b, const std::vector<std::string>& recipe_dirs) {
  if (b.contains("recipe")) return {require_string(b, "recipe"), "inline"};
  if (!b.contains("recipe_name"))
    throw ProtocolError(ErrorCode::bad_request, "submit needs 'recipe' (the text) or 'recipe_name' (a bundled recipe)");
  std::string source;
  try {
    source = resolve_recipe_name(require_string(b, "recipe_name"), recipe_dirs);
  } catch (const ProtocolError&) {
    throw;
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::invalid_recipe, e.what());
  }
  return {read_text(source), source};
}

std::deque<std::string> tail_lines(const fs::path& path, size_t n) {
  std::deque<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    out.push_back(std::move(line));
    if (out.size() > n) out.pop_front();
  }
  return out;
}
}  // namespace

json Controller::Impl::handle(const Request& req) {
  const auto& b = req.body;
  if (req.type == "info") return info();
  if (req.type == "shutdown") {
    spdlog::info("shutdown requested by a client");
    stopping = true;
    return {{"stopping", true}};
  }
  if (req.type == "submit") return submit(b);
  if (req.type == "list") {
    std::optional<RunState> only;
    if (b.contains("state")) {
      only = state_from_name(require_string(b, "state"));
      if (!only) throw ProtocolError(ErrorCode::bad_request, fmt::format("no run state '{}'", b["state"].dump()));
    }
    json runs = json::array();
    for (auto* r : registry->all())
      if (!only || r->state == *only) runs.push_back(status_of(*r));
    return {{"runs", runs}};
  }
  if (req.type == "status") return {{"run", status_of(find_run(b))}};
  if (req.type == "pause" || req.type == "resume" || req.type == "stop" || req.type == "cancel" ||
      req.type == "checkpoint")
    return control(req.type, b, req.id);
  if (req.type == "set") return set(b, req.id);
  if (req.type == "checkpoints") return checkpoints_of(b);
  if (req.type == "export") return start_export(b);
  if (req.type == "exports") return exports_of(b);
  if (req.type == "metrics") {
    const RunRecord& r = find_run(b);
    const int64_t since = optional_int(b, "since_step", 0, 0, INT64_MAX);
    const int64_t limit = optional_int(b, "limit", 1000, 1, 100000);
    json rows = json::array();
    std::ifstream in(fs::path(registry->run_dir(r.id)) / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line) && static_cast<int64_t>(rows.size()) < limit) {
      json row = parse_json_or_discard(line);
      if (row.is_object() && row.value("step", int64_t{0}) > since) rows.push_back(std::move(row));
    }
    return {{"run", r.id}, {"metrics", rows}};
  }
  if (req.type == "logs") {
    const RunRecord& r = find_run(b);
    const int64_t lines = optional_int(b, "lines", 100, 1, 100000);
    const std::string source = b.value("source", "train");
    fs::path file;
    if (source == "train") {
      file = fs::path(registry->run_dir(r.id)) / "train.log";
    } else if (source == "worker") {
      const int64_t rank = optional_int(b, "rank", 0, 0, r.workers - 1);
      file = fs::path(registry->run_dir(r.id)) / fmt::format("worker-rank{}.log", rank);
    } else {
      throw ProtocolError(ErrorCode::bad_request, fmt::format("log source '{}' is neither 'train' nor 'worker'", source));
    }
    json out = json::array();
    for (auto& l : tail_lines(file, static_cast<size_t>(lines))) out.push_back(std::move(l));
    return {{"run", r.id}, {"source", source}, {"lines", out}};
  }
  throw ProtocolError(ErrorCode::unknown_type, fmt::format("unknown request type '{}'", req.type));
}

json Controller::Impl::info() {
  int queued = 0, running = 0;
  for (auto* r : registry->all()) {
    if (r->state == RunState::queued) ++queued;
    if (has_workers(r->state)) ++running;
  }
  return {{"protocol", kProtocolVersion},
          {"version", TIDE_VERSION},
          {"pid", ::getpid()},
          {"epoch", epoch},
          {"state_dir", fs::absolute(opt.state_dir).string()},
          {"slots", {{"kind", "cpu"}, {"total", opt.cpu_slots}, {"used", slots_in_use()}}},
          {"gpus", {{"devices", opt.gpus}, {"free", free_gpus()}}},
          {"cores", opt.cores},
          {"endpoints", {{"commands", command_eps}, {"events", event_eps}}},
          {"curve_public_key", curve ? json(curve->public_key) : json(nullptr)},
          {"runs", {{"queued", queued}, {"active", running}}}};
}

RunRecord& Controller::Impl::find_run(const json& body) {
  const std::string id = require_string(body, "run");
  RunRecord* r = registry->find(id);
  if (!r) throw ProtocolError(ErrorCode::not_found, fmt::format("no run '{}'", id));
  return *r;
}

const RunConfig& Controller::Impl::config_of(const RunRecord& r) {
  auto it = configs.find(r.id);
  if (it == configs.end()) {
    // After a daemon restart: the resolved recipe the run was submitted with.
    const json resolved = read_json_file((fs::path(registry->run_dir(r.id)) / "recipe.json").string());
    RunConfig cfg = config_from_json(resolved);
    for (const auto& [path, value] : r.live.items())
      if (const FieldSpec* f = find_field(path)) f->set(cfg, value);
    it = configs.emplace(r.id, cfg).first;
  }
  return it->second;
}

json Controller::Impl::status_of(const RunRecord& r) {
  json j = r.to_json();
  if (const auto m = last_metrics.find(r.id); m != last_metrics.end()) j["metrics"] = m->second;
  if (const auto a = active.find(r.id); a != active.end() && a->second.group) {
    json pids = json::object();
    for (const auto& [pid, rank] : a->second.group->live()) pids[std::to_string(rank)] = pid;
    j["pids"] = pids;
    if (!a->second.gpus.empty()) j["gpus"] = a->second.gpus;
  }
  j["run_dir"] = fs::absolute(registry->run_dir(r.id)).string();
  return j;
}

json Controller::Impl::submit(const json& b) {
  std::string key;
  if (b.contains("idempotency_key") && !b["idempotency_key"].is_null()) {
    key = require_string(b, "idempotency_key");
    if (key.size() > 256)
      throw ProtocolError(ErrorCode::bad_request,
                          fmt::format("'idempotency_key' has {} characters; 256 at most", key.size()));
  }
  if (RunRecord* existing = registry->find_by_key(key)) return {{"run", status_of(*existing)}, {"duplicate", true}};
  const std::vector<std::string> overrides = submitted_overrides(b);
  const auto [text, source] = submitted_recipe(b, opt.recipe_dirs);
  std::string workdir = b.contains("workdir") ? require_string(b, "workdir") : fs::current_path().string();
  if (!fs::path(workdir).is_absolute() || !fs::is_directory(workdir))
    throw ProtocolError(ErrorCode::bad_request, fmt::format("workdir '{}' is not an absolute directory", workdir));

  RunConfig cfg;
  try {
    // Relative paths in the recipe (data.path) resolve against the workdir, as the workers will.
    Recipe recipe = Recipe::load_string(text, source == "inline" ? "recipe" : source, overrides, submit_limits());
    cfg = recipe.config();
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::invalid_recipe, e.what());
  }
  if (!is_safe_name(cfg.name))
    throw ProtocolError(ErrorCode::invalid_recipe,
                        fmt::format("name '{}' may hold only letters, digits, '.', '_' and '-' (64 at most)", cfg.name));
  const int64_t layout = std::max<int64_t>(cfg.parallel.dp, 1) * cfg.parallel.tp * cfg.parallel.pp;
  const int64_t workers = optional_int(b, "workers", layout, 1, 4096);
  if (cfg.device == "cuda" && workers > static_cast<int64_t>(opt.gpus.size()))
    throw ProtocolError(ErrorCode::unavailable,
                        fmt::format("the run needs {} GPUs (device = \"cuda\", one per worker) and this daemon has {}",
                                    workers, opt.gpus.size()));
  if (cfg.device != "cuda" && workers > opt.cpu_slots)
    throw ProtocolError(ErrorCode::unavailable, fmt::format("the run needs {} workers and this daemon has {} slots",
                                                            workers, opt.cpu_slots));
  try {
    // What every worker would refuse, refused here, before the run exists.
    check_supported_layout(cfg, static_cast<int>(workers));
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::invalid_recipe, fmt::format("{} workers: {}", workers, e.what()));
  }
  RunRecord r;
  r.id = registry->allocate(cfg.name);
  r.name = cfg.name;
  r.seq = registry->next_seq();
  r.priority = optional_int(b, "priority", 0, -1000, 1000);
  r.workers = static_cast<int>(workers);
  r.recipe_source = source;
  r.overrides = overrides;
  r.workdir = workdir;
  r.idempotency_key = key;
  r.max_restarts = cfg.supervise.max_restarts;
  r.heartbeat_timeout_s = cfg.supervise.heartbeat_timeout_s;
  r.total_steps = cfg.schedule.steps;
  r.submitted = unix_now();
  const fs::path dir = registry->run_dir(r.id);
  std::ofstream(dir / "recipe.lua", std::ios::trunc) << text;
  std::ofstream(dir / "recipe.json", std::ios::trunc) << config_to_json(cfg).dump(2) << "\n";
  configs[r.id] = cfg;
  registry->save(r);
  publish(r.id, "state", {{"state", "queued"}, {"previous", nullptr}, {"attempt", 0}, {"restarts", 0}});
  spdlog::info("run {} queued: {} workers, priority {}, from {}", r.id, r.workers, r.priority, source);
  return {{"run", status_of(*registry->find(r.id))}, {"duplicate", false}};
}

json Controller::Impl::control(const std::string& op, const json& b, const json& request_id) {
  RunRecord& r = find_run(b);
  auto refuse = [&] {
    throw ProtocolError(ErrorCode::invalid_state, fmt::format("cannot {} run {}: it is {}", op, r.id, state_name(r.state)));
  };
  if (op == "cancel") {
    if (is_finished(r.state)) refuse();
    if (r.state == RunState::queued) {
      r.error.clear();
      set_state(r, RunState::cancelled);
    } else {
      auto& a = active[r.id];
      a.cancel_requested = true;
      if (a.group && !a.ending) {
        a.ending = true;
        a.group->terminate(std::chrono::seconds(5));
      }
    }
    return {{"run", r.id}, {"state", state_name(r.state)}};
  }
  if (op == "resume" && (r.state == RunState::stopped || r.state == RunState::failed)) {
    // A stopped or failed run continues from its latest checkpoint.
    r.resume = true;
    r.error.clear();
    r.restarts = 0;
    set_state(r, RunState::queued);
    return {{"run", r.id}, {"state", state_name(r.state)}};
  }
  if (op == "stop" && r.state == RunState::queued) {
    set_state(r, RunState::stopped);
    return {{"run", r.id}, {"state", state_name(r.state)}};
  }
  const bool live = r.state == RunState::starting || r.state == RunState::running || r.state == RunState::paused;
  if (!live) refuse();
  if (op == "pause" && r.state == RunState::paused) refuse();
  if (op == "resume" && r.state != RunState::paused) refuse();
  auto& a = active[r.id];
  if (op == "stop") a.stop_requested = true;
  a.pending.push_back({{"op", op}, {"id", request_id}});
  deliver(r.id);
  return {{"run", r.id}, {"state", state_name(r.state)}, {"accepted", op}};
}

json Controller::Impl::set(const json& b, const json& request_id) {
  RunRecord& r = find_run(b);
  const json& values = require(b, "values", json::value_t::object);
  if (values.empty()) throw ProtocolError(ErrorCode::bad_request, "'values' is empty");
  if (is_finished(r.state))
    throw ProtocolError(ErrorCode::invalid_state, fmt::format("run {} is {}", r.id, state_name(r.state)));
  const bool running = has_workers(r.state) && active.count(r.id);
  try {
    // Checked as every rank will check it. A running job's view changes when rank 0
    // reports the change applied (record_live_change); a queued run's at once.
    const RunConfig& current = config_of(r);
    if (running) {
      check_live_change(current, values, active[r.id].batch);
    } else {
      const LiveChange change = check_live_change(current, values, batch_layout(current, r.workers));
      check_supported_layout(change.next, r.workers);
      record_live_change(r, values);
    }
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::invalid_value, e.what());
  }
  if (running) {
    active[r.id].pending.push_back({{"op", "set"}, {"values", values}, {"id", request_id}});
    deliver(r.id);
  }
  return {{"run", r.id}, {"accepted", values}};
}

void Controller::Impl::record_live_change(RunRecord& r, const json& values) {
  RunConfig next = config_of(r);
  for (const auto& [path, value] : values.items()) {
    const FieldSpec* f = find_field(path);
    if (!f || f->live == LiveEffect::None) {
      spdlog::warn("run {}: ignoring a reported change of '{}', not a live field", r.id, path);
      continue;
    }
    try {
      f->set(next, value);
      r.live[path] = f->get(next);
    } catch (const std::exception& e) {
      spdlog::warn("run {}: ignoring a reported change: {}", r.id, e.what());
    }
  }
  configs[r.id] = next;
  registry->save(r);
}

}  // namespace tide::ipc
