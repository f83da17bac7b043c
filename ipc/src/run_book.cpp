#include "run_book.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/io/step_rows.h"
#include "tide/ipc/protocol.h"

namespace tide::ipc {
namespace fs = std::filesystem;
using json = nlohmann::json;

RunBook::RunBook(const std::string& state_dir, EventBus& bus) : registry_(state_dir), bus_(bus) {
  for (auto* r : registry_.all()) {
    if (has_workers(r->state)) {
      spdlog::info("run {} was {} when the controller last ended: queued to resume from its latest checkpoint", r->id,
                   state_name(r->state));
      r->state = RunState::queued;
      r->resume = true;
      registry_.save(*r);
    }
  }
}

RunRecord& RunBook::find(const json& body) {
  const std::string id = require_string(body, "run");
  RunRecord* r = registry_.find(id);
  if (!r) throw ProtocolError(ErrorCode::not_found, fmt::format("no run '{}'", id));
  return *r;
}

RunRecord& RunBook::add(RunRecord r, const RunConfig& cfg, const std::string& recipe_text) {
  r.id = registry_.allocate(cfg.name);
  r.seq = registry_.next_seq();
  const fs::path dir = registry_.run_dir(r.id);
  std::ofstream(dir / "recipe.lua", std::ios::trunc) << recipe_text;
  std::ofstream(dir / "recipe.json", std::ios::trunc) << config_to_json(cfg).dump(2) << "\n";
  configs_[r.id] = cfg;
  registry_.save(r);
  bus_.publish(r.id, "state", {{"state", "queued"}, {"previous", nullptr}, {"attempt", 0}, {"restarts", 0}});
  return *registry_.find(r.id);
}

const RunConfig& RunBook::config_of(const RunRecord& r) {
  auto it = configs_.find(r.id);
  if (it == configs_.end()) {
    // After a daemon restart: the resolved recipe the run was submitted with.
    const json resolved = read_json_file((fs::path(registry_.run_dir(r.id)) / "recipe.json").string());
    RunConfig cfg = config_from_json(resolved);
    for (const auto& [path, value] : r.live.items())
      if (const FieldSpec* f = find_field(path)) f->set(cfg, value);
    it = configs_.emplace(r.id, cfg).first;
  }
  return it->second;
}

void RunBook::set_state(RunRecord& r, RunState s, json extra) {
  const RunState before = r.state;
  r.state = s;
  if (is_finished(s)) r.finished = unix_now();
  registry_.save(r);
  extra["state"] = state_name(s);
  extra["previous"] = state_name(before);
  extra["attempt"] = r.attempt;
  extra["restarts"] = r.restarts;
  spdlog::info("run {}: {} -> {}{}", r.id, state_name(before), state_name(s),
               r.error.empty() || !is_finished(s) ? "" : " (" + r.error + ")");
  // Why a run failed or restarts belongs in its own log, beside its training lines.
  if (s == RunState::failed && !r.error.empty()) log(r.id, spdlog::level::err, "failed: " + r.error);
  if (s == RunState::restarting && extra.contains("reason"))
    log(r.id, spdlog::level::warn, "restarting: " + extra["reason"].get<std::string>());
  if (is_finished(s) && !r.error.empty()) extra["error"] = r.error;
  bus_.publish(r.id, "state", std::move(extra));
  if (is_finished(s)) {
    configs_.erase(r.id);
    rank_rows_.erase(r.id);
    for (const auto& fn : finished_listeners_) fn(r.id);
  }
}

void RunBook::record_live_change(RunRecord& r, const json& values) {
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
  configs_[r.id] = next;
  registry_.save(r);
}

void RunBook::record_metrics(RunRecord& r, const json& metrics) {
  if (r.state == RunState::starting) set_state(r, RunState::running);
  r.last_step = metrics.value("step", r.last_step);
  if (metrics.contains("val_loss")) {
    json& v = validation_[r.id] = {{"step", r.last_step}, {"val_loss", metrics["val_loss"]}};
    if (metrics.contains("val_losses")) v["val_losses"] = metrics["val_losses"];
  }
  bus_.publish(r.id, "metrics", metrics_[r.id] = metrics);
}

void RunBook::record_rank(const RunRecord& r, int rank, const json& figures) {
  if (!figures.is_object()) return;
  ranks_[r.id][std::to_string(rank)] = figures;
  const auto step = figures.find("step");
  if (r.workers < 2 || step == figures.end() || !step->is_number_integer()) return;
  RankRows& rows = rank_rows_[r.id];
  if (rows.attempt != r.attempt) {
    rows.pending.clear();
    rows.attempt = r.attempt;
  }
  auto& of_step = rows.pending[step->get<int64_t>()];
  of_step[rank] = figures;
  if (static_cast<int64_t>(of_step.size()) == r.workers) {
    write_rank_row(r, rows, step->get<int64_t>());
    // A step some rank never reported (it was replaced, or its message was dropped) is
    // not waited for once a later one is complete.
    rows.pending.erase(rows.pending.begin(), rows.pending.upper_bound(step->get<int64_t>()));
  }
  // A rank that stopped reporting holds back every row; keep a bounded few steps.
  constexpr size_t kPendingSteps = 64;
  while (rows.pending.size() > kPendingSteps) rows.pending.erase(rows.pending.begin());
}

// The per-rank figures as columns indexed by rank: compact for many ranks, and what a
// per-rank chart draws.
void RunBook::write_rank_row(const RunRecord& r, RankRows& rows, int64_t step) {
  static const char* const kColumns[] = {"step_seconds", "data_seconds", "comm_seconds", "checkpoint_seconds",
                                         "rss_mb",       "peak_rss_mb",  "peak_gpu_mb",  "comm_bytes"};
  json row = {{"step", step}};
  for (const char* column : kColumns) {
    json values = json::array();
    for (const auto& [rank, figures] : rows.pending.at(step))
      values.push_back(figures.contains(column) ? figures[column] : json(nullptr));
    row[column] = std::move(values);
  }
  const std::string path = (fs::path(registry_.run_dir(r.id)) / "ranks.jsonl").string();
  try {
    // The rows past this step are from an attempt that did not reach a checkpoint, or from
    // before the controller restarted: this attempt writes those steps anew.
    if (rows.written < 0 || step <= rows.written) truncate_step_rows(path, step - 1);
    rows.written = step;
    JsonlWriter(path).write(row);
  } catch (const std::exception& e) {
    spdlog::warn("run {}: cannot write its ranks.jsonl: {}", r.id, e.what());
  }
  bus_.publish(r.id, "ranks", std::move(row));
}

void RunBook::record_checkpoint(const RunRecord& r, const json& event) {
  json& stats = checkpoint_stats_[r.id];
  if (stats.is_null()) stats = {{"saved", 0}, {"failed", 0}, {"last_seconds", nullptr}, {"last_step", nullptr}};
  const bool ok = event.value("ok", false);
  stats[ok ? "saved" : "failed"] = stats[ok ? "saved" : "failed"].get<int64_t>() + 1;
  if (ok) {
    stats["last_seconds"] = event.value("seconds", 0.0);
    stats["last_step"] = event.value("step", int64_t{0});
  }
}

json RunBook::ranks_of(const std::string& run) const {
  const auto it = ranks_.find(run);
  return it == ranks_.end() ? json::object() : it->second;
}

json RunBook::checkpoint_stats_of(const std::string& run) const {
  const auto it = checkpoint_stats_.find(run);
  return it == checkpoint_stats_.end() ? json(nullptr) : it->second;
}

json RunBook::validation_of(const std::string& run) const {
  const auto it = validation_.find(run);
  return it == validation_.end() ? json(nullptr) : it->second;
}

const json* RunBook::latest_metrics(const std::string& run) const {
  const auto it = metrics_.find(run);
  return it == metrics_.end() ? nullptr : &it->second;
}

void RunBook::log(const std::string& run, spdlog::level::level_enum level, const std::string& line) {
  spdlog::log(level, "run {}: {}", run, line);
  try {
    // The file is the workers' too: each line goes out in one append.
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_st>(
        (fs::path(registry_.run_dir(run)) / "train.log").string(), false);
    spdlog::logger("controller", sink).log(level, "{}", line);
  } catch (const std::exception& e) {
    spdlog::warn("run {}: cannot append to its train.log: {}", run, e.what());
  }
  bus_.publish(run, "log", {{"level", spdlog::level::to_string_view(level).data()}, {"line", line}});
}

void RunBook::snapshot(const std::string& prefix) {
  auto runs = registry_.all();
  int finished_shown = 0;
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
    RunRecord& r = **it;
    if (is_finished(r.state) && ++finished_shown > 20) continue;
    if (run_topic(r.id, "state").compare(0, prefix.size(), prefix) == 0)
      bus_.publish(r.id, "state",
                   {{"state", state_name(r.state)},
                    {"attempt", r.attempt},
                    {"restarts", r.restarts},
                    {"last_step", r.last_step}},
                   true);
    const json* metrics = latest_metrics(r.id);
    if (metrics && run_topic(r.id, "metrics").compare(0, prefix.size(), prefix) == 0)
      bus_.publish(r.id, "metrics", *metrics, true);
  }
}

}  // namespace tide::ipc
