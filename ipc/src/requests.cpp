#include "requests.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "plan_request.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/data/training_data.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/live_change.h"
#include "tide/engine/run_layout.h"
#include "tide/engine/train/initial_weights.h"
#include "tide/scripting/recipe.h"

namespace tide::ipc {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A recipe submitted to a daemon gets less time than one run by hand: submits are
// evaluated one at a time, and the next waits behind it.
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

Requests::Requests(const ControllerOptions& opt, const ServiceInfo& service, RunBook& runs, Supervisor& supervisor,
                   PolicyHost& policies, Exports& exports, EventBus& bus, RecipeEvaluator& evaluator,
                   std::atomic<bool>& stopping)
    : opt_(opt),
      service_(service),
      runs_(runs),
      supervisor_(supervisor),
      policies_(policies),
      exports_(exports),
      bus_(bus),
      evaluator_(evaluator),
      stopping_(stopping) {}

std::optional<json> Requests::handle(const Request& req, const ReplyTo& to) {
  // Counted once the type is known to be one: made-up types add no series to /metrics.
  try {
    auto reply = dispatch(req, to);
    ++counts_[req.type];
    return reply;
  } catch (const ProtocolError& e) {
    if (e.code() != ErrorCode::unknown_type) ++counts_[req.type];
    throw;
  } catch (const std::exception&) {
    ++counts_[req.type];
    throw;
  }
}

std::optional<json> Requests::dispatch(const Request& req, const ReplyTo& to) {
  const auto& b = req.body;
  if (req.type == "info") return info();
  if (req.type == "shutdown") {
    spdlog::info("shutdown requested by a client");
    stopping_ = true;
    return json{{"stopping", true}};
  }
  if (req.type == "submit") return begin_submit(b, to);
  if (req.type == "list") return list(b);
  if (req.type == "status") return json{{"run", status_of(runs_.find(b))}};
  if (req.type == "pause" || req.type == "resume" || req.type == "stop" || req.type == "cancel" ||
      req.type == "checkpoint")
    return control(req.type, b, req.id);
  if (req.type == "set") return set(b, req.id);
  if (req.type == "checkpoints") return exports_.checkpoints_of(b);
  if (req.type == "export") return exports_.start(b);
  if (req.type == "exports") return exports_.list(b);
  if (req.type == "verify") return exports_.verify(b);
  if (req.type == "metrics") return metrics(b);
  if (req.type == "logs") return logs(b);
  if (req.type == "recipe") return recipe(b);
  if (req.type == "plan") return begin_plan(b, to);
  throw ProtocolError(ErrorCode::unknown_type, fmt::format("unknown request type '{}'", req.type));
}

json Requests::list(const json& b) {
  std::optional<RunState> only;
  if (b.contains("state")) {
    only = state_from_name(require_string(b, "state"));
    if (!only) throw ProtocolError(ErrorCode::bad_request, fmt::format("no run state '{}'", b["state"].dump()));
  }
  json runs = json::array();
  for (auto* r : runs_.registry().all())
    if (!only || r->state == *only) runs.push_back(status_of(*r));
  return {{"runs", runs}};
}

json Requests::metrics(const json& b) {
  const RunRecord& r = runs_.find(b);
  const int64_t since = optional_int(b, "since_step", 0, 0, INT64_MAX);
  const int64_t limit = optional_int(b, "limit", 1000, 1, 100000);
  // "train": rank 0's rows (metrics.jsonl); "ranks": every rank's figures of each step,
  // as columns by rank (ranks.jsonl, runs of several ranks).
  const std::string source = b.contains("source") ? require_string(b, "source") : "train";
  if (source != "train" && source != "ranks")
    throw ProtocolError(ErrorCode::bad_request,
                        fmt::format("metrics source '{}' is neither 'train' nor 'ranks'", source));
  json rows = json::array();
  std::ifstream in(fs::path(runs_.registry().run_dir(r.id)) / (source == "train" ? "metrics.jsonl" : "ranks.jsonl"));
  std::string line;
  while (std::getline(in, line) && static_cast<int64_t>(rows.size()) < limit) {
    json row = parse_json_or_discard(line);
    if (row.is_object() && row.value("step", int64_t{0}) > since) rows.push_back(std::move(row));
  }
  return {{"run", r.id}, {"source", source}, {"metrics", rows}};
}

json Requests::logs(const json& b) {
  const RunRecord& r = runs_.find(b);
  const int64_t lines = optional_int(b, "lines", 100, 1, 100000);
  const std::string source = b.value("source", "train");
  fs::path file;
  if (source == "train") {
    file = fs::path(runs_.registry().run_dir(r.id)) / "train.log";
  } else if (source == "worker") {
    const int64_t rank = optional_int(b, "rank", 0, 0, r.workers - 1);
    file = fs::path(runs_.registry().run_dir(r.id)) / fmt::format("worker-rank{}.log", rank);
  } else {
    throw ProtocolError(ErrorCode::bad_request, fmt::format("log source '{}' is neither 'train' nor 'worker'", source));
  }
  json out = json::array();
  for (auto& l : tail_lines(file, static_cast<size_t>(lines))) out.push_back(std::move(l));
  return {{"run", r.id}, {"source", source}, {"lines", out}};
}

json Requests::recipe(const json& b) {
  const RunRecord& r = runs_.find(b);
  const fs::path file = fs::path(runs_.registry().run_dir(r.id)) / "recipe.lua";
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ProtocolError(ErrorCode::not_found, fmt::format("run {} has no {}", r.id, file.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return {
      {"run", r.id}, {"recipe", text.str()}, {"source", r.recipe_source}, {"overrides", r.overrides}, {"live", r.live}};
}

json Requests::info() {
  int queued = 0, running = 0;
  for (auto* r : runs_.registry().all()) {
    if (r->state == RunState::queued) ++queued;
    if (has_workers(r->state)) ++running;
  }
  return {{"protocol", kProtocolVersion},
          {"version", TIDE_VERSION},
          {"pid", ::getpid()},
          {"epoch", bus_.epoch()},
          {"state_dir", fs::absolute(opt_.state_dir).string()},
          {"slots", {{"kind", "cpu"}, {"total", opt_.cpu_slots}, {"used", supervisor_.slots_in_use()}}},
          {"gpus", {{"devices", opt_.gpus}, {"free", supervisor_.free_gpus()}}},
          {"cores", opt_.cores},
          {"requests", counts_},
          {"scheduler", opt_.slurm.enabled ? json("slurm") : json("local")},
          {"endpoints",
           {{"commands", service_.command_endpoints},
            {"events", service_.event_endpoints},
            {"http", service_.http_url.empty() ? json(nullptr) : json(service_.http_url)}}},
          {"curve_public_key", service_.curve_public_key ? json(*service_.curve_public_key) : json(nullptr)},
          {"runs", {{"queued", queued}, {"active", running}}}};
}

json Requests::status_of(const RunRecord& r) {
  json j = r.to_json();
  if (const json* m = runs_.latest_metrics(r.id)) j["metrics"] = *m;
  j["ranks"] = runs_.ranks_of(r.id);
  j["checkpoint_stats"] = runs_.checkpoint_stats_of(r.id);
  j["validation"] = runs_.validation_of(r.id);
  supervisor_.describe(r.id, j);
  j["run_dir"] = fs::absolute(runs_.registry().run_dir(r.id)).string();
  return j;
}

namespace {
// checkpoint.init_from, where the workers will read it (relative to the workdir): weights
// that do not fit the recipe's model are refused at submit, naming the fields, as the
// workers would refuse them at start. This daemon's own workers see its file system, so
// a path it cannot find is refused too; Slurm's nodes may mount what the daemon does not,
// so there a path the daemon cannot see is left to them.
void check_init_from(const RunConfig& cfg, const std::string& workdir, bool remote_workers) {
  if (cfg.checkpoint.init_from.empty()) return;
  fs::path path(cfg.checkpoint.init_from);
  if (path.is_relative()) path = fs::path(workdir) / path;
  std::error_code ec;
  if (remote_workers && !fs::exists(path, ec)) return;
  check_initial_weights(path.string(), cfg.model);
}
}  // namespace

std::optional<json> Requests::begin_submit(const json& b, const ReplyTo& to) {
  PendingSubmit s;
  s.to = to;
  s.body = b;
  if (b.contains("idempotency_key") && !b["idempotency_key"].is_null()) {
    s.key = require_string(b, "idempotency_key");
    if (s.key.size() > 256)
      throw ProtocolError(ErrorCode::bad_request,
                          fmt::format("'idempotency_key' has {} characters; 256 at most", s.key.size()));
  }
  if (RunRecord* existing = runs_.registry().find_by_key(s.key))
    return json{{"run", status_of(*existing)}, {"duplicate", true}};
  s.overrides = submitted_overrides(b);
  std::tie(s.text, s.source) = submitted_recipe(b, opt_.recipe_dirs);
  s.workdir = b.contains("workdir") ? require_string(b, "workdir") : fs::current_path().string();
  if (!fs::path(s.workdir).is_absolute() || !fs::is_directory(s.workdir))
    throw ProtocolError(ErrorCode::bad_request, fmt::format("workdir '{}' is not an absolute directory", s.workdir));
  // Relative paths in the recipe (data.path, data.blend, checkpoint.init_from) resolve
  // against the workdir, as the workers will. The weights a run starts from and its
  // datasets' metadata are checked on the evaluator's thread (file reads).
  auto check = [workdir = s.workdir, remote = opt_.slurm.enabled](const Recipe& recipe) {
    check_init_from(recipe.config(), workdir, remote);
    check_training_data(recipe.config().data, workdir, remote);
    return json();
  };
  evaluate(std::move(s), std::move(check));
  return std::nullopt;
}

std::vector<std::pair<ReplyTo, std::string>> Requests::finished_submits(bool wait) {
  std::vector<std::pair<ReplyTo, std::string>> out;
  size_t done = 0;
  // In the order submitted, so that runs queue in that order.
  for (; done < submits_.size() && (wait || is_ready(submits_[done].evaluated)); ++done) {
    const PendingSubmit& s = submits_[done];
    std::string reply;
    try {
      if (s.plan) {
        const EvaluatedRecipe& planned = s.evaluated.get();
        if (!planned.error.empty()) throw ProtocolError(ErrorCode::invalid_recipe, planned.error);
        reply = reply_ok(s.to.id, planned.answer);
      } else {
        reply = reply_ok(s.to.id, finish_submit(s));
      }
    } catch (const ProtocolError& e) {
      spdlog::warn("request refused ({}): {}", error_name(e.code()), e.what());
      reply = reply_error(s.to.id, e.code(), e.what());
    } catch (const std::exception& e) {
      spdlog::error("request failed: {}", e.what());
      reply = reply_error(s.to.id, ErrorCode::internal, e.what());
    }
    out.emplace_back(s.to, std::move(reply));
  }
  submits_.erase(submits_.begin(), submits_.begin() + static_cast<std::ptrdiff_t>(done));
  return out;
}

std::optional<json> Requests::begin_plan(const json& b, const ReplyTo& to) {
  PlanRequest request = parse_plan_request(b, [this](int ranks) { return local_cpu(ranks); });
  PendingSubmit s;
  s.plan = true;
  s.to = to;
  s.overrides = submitted_overrides(b);
  std::tie(s.text, s.source) = submitted_recipe(b, opt_.recipe_dirs);
  evaluate(std::move(s), [request = std::move(request)](const Recipe& recipe) {
    return json{{"plan", to_json(plan_layouts(recipe.config(), request.cluster, request.options), request.top)}};
  });
  return std::nullopt;
}

void Requests::evaluate(PendingSubmit s, RecipeEvaluator::FollowUp follow_up) {
  s.evaluated = evaluator_.post(
      [text = s.text, chunk = s.source == "inline" ? "recipe" : s.source, overrides = s.overrides] {
        return Recipe::load_string(text, chunk, overrides, submit_limits());
      },
      std::move(follow_up));
  submits_.push_back(std::move(s));
}

DeviceSpec Requests::local_cpu(int ranks) const {
  const std::string path = default_calibration_path();
  try {
    if (const auto stored = stored_cpu_device(path, ranks)) return *stored;
  } catch (const std::exception& e) {
    spdlog::warn("ignoring the calibration {}: {}", path, e.what());
  }
  return nominal_cpu_device(ranks);
}

LayoutChoice Requests::auto_layout(const RunConfig& cfg, int workers) const {
  if (opt_.slurm.enabled || cfg.device == "cuda")
    throw ProtocolError(ErrorCode::invalid_recipe,
                        "parallel.auto: tided plans runs on its own CPU slots only; for GPU or Slurm runs, choose the "
                        "layout with `tide plan --device ...` and set it in the recipe");
  Cluster cluster;
  cluster.devices_per_node = workers;
  cluster.device = local_cpu(workers);
  try {
    LayoutChoice choice = choose_layout(cfg, cluster);
    spdlog::info("{}", choice.explanation);
    return choice;
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::invalid_recipe, fmt::format("{} workers: {}", workers, e.what()));
  }
}

json Requests::finish_submit(const PendingSubmit& s) {
  // The same key may have been submitted again while this one was evaluated.
  if (RunRecord* existing = runs_.registry().find_by_key(s.key))
    return {{"run", status_of(*existing)}, {"duplicate", true}};
  const EvaluatedRecipe& evaluated = s.evaluated.get();
  if (!evaluated.recipe || !evaluated.error.empty()) throw ProtocolError(ErrorCode::invalid_recipe, evaluated.error);
  RunConfig cfg;
  try {
    cfg = evaluated.recipe->config();
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::invalid_recipe, e.what());
  }
  if (!is_safe_name(cfg.name))
    throw ProtocolError(ErrorCode::invalid_recipe,
                        fmt::format("name '{}' may hold only letters, digits, '.', '_' and '-' (64 at most)", cfg.name));
  const int64_t layout = std::max<int64_t>(cfg.parallel.dp, 1) * cfg.parallel.cp * cfg.parallel.tp * cfg.parallel.pp;
  const int64_t workers = optional_int(s.body, "workers", layout, 1, 4096);
  // Under Slurm the cluster's size is the scheduler's to judge (a job no partition can
  // hold waits, and says why).
  const bool local = !opt_.slurm.enabled;
  if (local && cfg.device == "cuda" && workers > static_cast<int64_t>(opt_.gpus.size()))
    throw ProtocolError(ErrorCode::unavailable,
                        fmt::format("the run needs {} GPUs (device = \"cuda\", one per worker) and this daemon has {}",
                                    workers, opt_.gpus.size()));
  if (local && cfg.device != "cuda" && workers > opt_.cpu_slots)
    throw ProtocolError(ErrorCode::unavailable,
                        fmt::format("the run needs {} workers and this daemon has {} slots", workers, opt_.cpu_slots));
  std::vector<std::string> overrides = s.overrides;
  if (cfg.parallel.auto_layout) {
    // The planner's layout, decided once here and handed to every worker as overrides.
    const auto choice = auto_layout(cfg, static_cast<int>(workers));
    choice.chosen.layout.apply_to(cfg);
    cfg.parallel.auto_layout = false;
    overrides.insert(overrides.end(), choice.overrides.begin(), choice.overrides.end());
  }
  try {
    // What every worker would refuse, refused here, before the run exists.
    check_supported_layout(cfg, static_cast<int>(workers));
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::invalid_recipe, fmt::format("{} workers: {}", workers, e.what()));
  }
  RunRecord r;
  r.name = cfg.name;
  r.priority = optional_int(s.body, "priority", 0, -1000, 1000);
  r.workers = static_cast<int>(workers);
  r.recipe_source = s.source;
  r.overrides = std::move(overrides);
  r.workdir = s.workdir;
  r.idempotency_key = s.key;
  r.max_restarts = cfg.supervise.max_restarts;
  r.heartbeat_timeout_s = cfg.supervise.heartbeat_timeout_s;
  r.total_steps = cfg.schedule.steps;
  r.layout = {{"dp", workers / (cfg.parallel.cp * cfg.parallel.tp * cfg.parallel.pp)},
              {"cp", cfg.parallel.cp},
              {"tp", cfg.parallel.tp},
              {"pp", cfg.parallel.pp},
              {"ep", cfg.parallel.ep},
              {"zero", cfg.parallel.zero},
              {"offload", cfg.parallel.offload_optimizer},
              {"device", cfg.device},
              {"micro_batch", cfg.batch.micro_batch},
              {"global_batch", cfg.batch.global_batch},
              {"seq_len", cfg.data.seq_len}};
  r.submitted = unix_now();
  RunRecord& added = runs_.add(std::move(r), cfg, s.text);
  policies_.load(added);
  spdlog::info("run {} queued: {} workers, priority {}, from {}", added.id, added.workers, added.priority, s.source);
  return {{"run", status_of(added)}, {"duplicate", false}};
}

json Requests::control(const std::string& op, const json& b, const json& request_id) {
  RunRecord& r = runs_.find(b);
  auto refuse = [&] {
    throw ProtocolError(ErrorCode::invalid_state, fmt::format("cannot {} run {}: it is {}", op, r.id, state_name(r.state)));
  };
  if (op == "cancel") {
    if (is_finished(r.state)) refuse();
    if (r.state == RunState::queued) {
      r.error.clear();
      runs_.set_state(r, RunState::cancelled);
    } else {
      supervisor_.cancel(r.id);
    }
    return {{"run", r.id}, {"state", state_name(r.state)}};
  }
  if (op == "resume" && (r.state == RunState::stopped || r.state == RunState::failed)) {
    // A stopped or failed run continues from its latest checkpoint.
    r.resume = true;
    r.error.clear();
    r.restarts = 0;
    runs_.set_state(r, RunState::queued);
    policies_.load(r);
    return {{"run", r.id}, {"state", state_name(r.state)}};
  }
  if (op == "stop" && r.state == RunState::queued) {
    runs_.set_state(r, RunState::stopped);
    return {{"run", r.id}, {"state", state_name(r.state)}};
  }
  const bool live = r.state == RunState::starting || r.state == RunState::running || r.state == RunState::paused;
  if (!live || !supervisor_.find(r.id)) refuse();
  if (op == "pause" && r.state == RunState::paused) refuse();
  if (op == "resume" && r.state != RunState::paused) refuse();
  supervisor_.command(r.id, {{"op", op}, {"id", request_id}});
  return {{"run", r.id}, {"state", state_name(r.state)}, {"accepted", op}};
}

json Requests::set(const json& b, const json& request_id) {
  RunRecord& r = runs_.find(b);
  const json& values = require(b, "values", json::value_t::object);
  if (values.empty()) throw ProtocolError(ErrorCode::bad_request, "'values' is empty");
  if (is_finished(r.state))
    throw ProtocolError(ErrorCode::invalid_state, fmt::format("run {} is {}", r.id, state_name(r.state)));
  const ActiveRun* running = has_workers(r.state) ? supervisor_.find(r.id) : nullptr;
  try {
    // Checked as every rank will check it. A running job's view changes when rank 0
    // reports the change applied (RunBook::record_live_change); a queued run's at once.
    const RunConfig& current = runs_.config_of(r);
    if (running) {
      check_live_change(current, values, running->batch);
    } else {
      const LiveChange change = check_live_change(current, values, batch_layout(current, r.workers));
      check_supported_layout(change.next, r.workers);
      runs_.record_live_change(r, values);
    }
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::invalid_value, e.what());
  }
  if (running) supervisor_.command(r.id, {{"op", "set"}, {"values", values}, {"id", request_id}});
  return {{"run", r.id}, {"accepted", values}};
}

void Requests::apply(RunRecord& r, const json& command, const std::string& request_id) {
  const std::string op = command["op"].get<std::string>();
  if (op == "set")
    set({{"run", r.id}, {"values", command["values"]}}, request_id);
  else
    control(op, {{"run", r.id}}, request_id);
}

}  // namespace tide::ipc
