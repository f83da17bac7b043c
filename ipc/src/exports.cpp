#include "exports.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tide/engine/checkpoint/checkpoint_index.h"
#include "tide/ipc/protocol.h"

namespace tide::ipc {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// Finished exports and verifications kept for requests; older ones are forgotten.
constexpr size_t kFinishedExportsKept = 256;

// Why a `tide-worker export` or `verify` child failed, from its log: the last error it logged.
std::string last_error_line(const std::string& log) {
  std::ifstream in(log);
  std::string line, last, last_error;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = line;
    if (const auto at = line.find("[error] "); at != std::string::npos) last_error = line.substr(at + 8);
  }
  return last_error.empty() ? last : last_error;
}

json describe_checkpoint(const CheckpointEntry& c) {
  json j = {{"step", c.step}, {"dir", c.path}};
  try {
    const json m = read_manifest(c.path);
    uint64_t bytes = 0;
    for (const auto& [name, info] : m["files"].items()) bytes += info.value("bytes", uint64_t{0});
    j["tokens_seen"] = m.value("tokens_seen", int64_t{0});
    j["layout"] = m.value("layout", json::object());
    j["files"] = m["files"].size();
    j["bytes"] = bytes;
  } catch (const std::exception& e) {
    j["error"] = e.what();  // listed all the same: `tide ckpt verify` says more
  }
  return j;
}
}  // namespace

Exports::Exports(const ControllerOptions& opt, RunBook& runs, EventBus& bus) : opt_(opt), runs_(runs), bus_(bus) {}

json ExportJob::to_json() const {
  json j = {{"id", id},   {"kind", kind},   {"run", run},        {"step", step}, {"checkpoint", checkpoint},
            {"log", log}, {"state", state}, {"started", started}};
  if (kind == "export") {
    j["out"] = out;
    j["dtype"] = dtype;
    j["adapter"] = adapter;
  }
  if (finished > 0) j["finished"] = finished;
  if (!error.empty()) j["error"] = error;
  if (!progress.is_null()) j["progress"] = progress;
  return j;
}

json Exports::checkpoints_of(const json& body) {
  const RunRecord& r = runs_.find(body);
  json found = json::array();
  for (const auto& c : list_checkpoints((fs::path(runs_.registry().run_dir(r.id)) / "checkpoints").string())) {
    json j = describe_checkpoint(c);
    // The newest verification of it by this controller, if any.
    for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it)
      if (it->second.kind == "verify" && it->second.checkpoint == c.path) {
        j["verify"] = it->second.to_json();
        break;
      }
    found.push_back(std::move(j));
  }
  return {{"run", r.id}, {"checkpoints", found}};
}

Exports::Chosen Exports::choose(const RunRecord& r, int64_t step) const {
  const auto all = list_checkpoints((fs::path(runs_.registry().run_dir(r.id)) / "checkpoints").string());
  if (all.empty())
    throw ProtocolError(ErrorCode::invalid_state, fmt::format("run {} has no committed checkpoint", r.id));
  if (step < 0) step = all.back().step;
  auto it = std::find_if(all.begin(), all.end(), [&](const CheckpointEntry& c) { return c.step == step; });
  if (it == all.end())
    throw ProtocolError(
        ErrorCode::bad_request,
        fmt::format("run {} has no committed checkpoint at step {} (newest: {})", r.id, step, all.back().step));
  return {step, it->path};
}

json Exports::launch(ExportJob job, std::vector<std::string> args) {
  // Only the oldest finished ones are ever forgotten, so the newest number stays known.
  const int64_t number = jobs_.empty() ? 1 : jobs_.rbegin()->first + 1;
  job.id = fmt::format("{}-{}", job.kind, number);
  const fs::path run_dir = runs_.registry().run_dir(job.run);
  job.log = (run_dir / (job.id + ".log")).string();
  job.progress_file = (run_dir / (job.id + ".progress.json")).string();
  args.insert(args.end(), {"--progress-file", job.progress_file});
  job.started = unix_now();
  WorkerSpec spec;
  spec.executable = opt_.worker_executable;
  spec.args = std::move(args);
  spec.log_file = job.log;
  spec.working_dir = run_dir.string();
  spec.die_with_parent = true;
  std::error_code ec;
  fs::remove(job.log, ec);  // a log and progress left by an earlier controller's job of this id
  fs::remove(job.progress_file, ec);
  try {
    job.child = std::make_unique<WorkerGroup>(spec);
  } catch (const std::exception& e) {
    throw ProtocolError(ErrorCode::internal, fmt::format("cannot start the {}: {}", job.kind, e.what()));
  }
  json reply = job.to_json();
  bus_.publish(job.run, job.kind, reply);
  jobs_.emplace(number, std::move(job));
  return reply;
}

json Exports::verify(const json& body) {
  const RunRecord& r = runs_.find(body);
  const Chosen c = choose(r, optional_int(body, "step", -1, 0, INT64_MAX));  // -1: the newest
  for (const auto& [n, job] : jobs_)
    if (job.state == "running" && job.kind == "verify" && job.checkpoint == c.path)
      throw ProtocolError(ErrorCode::invalid_state, fmt::format("{} is already verifying {}", job.id, c.path));
  ExportJob job;
  job.kind = "verify";
  job.run = r.id;
  job.step = c.step;
  job.checkpoint = c.path;
  spdlog::info("run {}: verifying the checkpoint of step {}", r.id, c.step);
  return {{"run", r.id}, {"verify", launch(std::move(job), {"verify", c.path})}};
}

json Exports::start(const json& body) {
  const RunRecord& r = runs_.find(body);
  const fs::path run_dir = runs_.registry().run_dir(r.id);
  const int64_t asked = optional_int(body, "step", -1, 0, INT64_MAX);  // -1: the newest
  const std::string dtype = body.contains("dtype") ? require_string(body, "dtype") : "F32";
  if (dtype != "F32" && dtype != "BF16" && dtype != "F16")
    throw ProtocolError(ErrorCode::bad_request, fmt::format("dtype '{}' is none of F32, BF16, F16", dtype));
  const bool adapter = body.contains("adapter") && require(body, "adapter", json::value_t::boolean).get<bool>();
  const std::string out_text = require_string(body, "out");
  if (out_text.empty()) throw ProtocolError(ErrorCode::bad_request, "out is empty");
  // Relative to the run directory, so that a remote client need not know the daemon's paths.
  const fs::path out = fs::weakly_canonical(run_dir / out_text);
  const std::string checkpoints = fs::weakly_canonical(run_dir / "checkpoints").string() + "/";
  if ((out.string() + "/").rfind(checkpoints, 0) == 0)
    throw ProtocolError(ErrorCode::bad_request, fmt::format("out {} is inside the run's checkpoints", out.string()));
  const std::string own = fs::weakly_canonical(run_dir).string() + "/";
  if (own.rfind(out.string() + (out.string().back() == '/' ? "" : "/"), 0) == 0)
    throw ProtocolError(ErrorCode::bad_request,
                        fmt::format("out {} holds the run directory; name a directory of its own", out.string()));
  const Chosen c = choose(r, asked);
  for (const auto& [n, job] : jobs_)
    if (job.state == "running" && job.kind == "export" && job.out == out.string())
      throw ProtocolError(ErrorCode::invalid_state, fmt::format("{} is already writing {}", job.id, out.string()));

  ExportJob job;
  job.kind = "export";
  job.run = r.id;
  job.step = c.step;
  job.checkpoint = c.path;
  job.out = out.string();
  job.dtype = dtype;
  job.adapter = adapter;
  spdlog::info("run {}: export of step {} to {} ({}{})", r.id, c.step, job.out, dtype, adapter ? ", adapters" : "");
  std::vector<std::string> args{"export", c.path, "-o", out.string(), "--dtype", dtype};
  if (adapter) args.emplace_back("--adapter");  // the child refuses a run without LoRA, naming it
  return {{"run", r.id}, {"export", launch(std::move(job), std::move(args))}};
}

json Exports::list(const json& body) {
  const RunRecord& r = runs_.find(body);
  if (body.contains("export")) {  // one export, for a client waiting on it
    const std::string id = require_string(body, "export");
    for (const auto& [n, job] : jobs_)
      if (job.run == r.id && job.id == id) return {{"run", r.id}, {job.kind, job.to_json()}};
    throw ProtocolError(ErrorCode::not_found,
                        fmt::format("run {} has no export '{}' (exports end with their daemon)", r.id, id));
  }
  json found = json::array();
  for (const auto& [n, job] : jobs_)
    if (job.run == r.id && job.kind == "export") found.push_back(job.to_json());
  return {{"run", r.id}, {"exports", found}};
}

bool Exports::read_progress(ExportJob& job) const {
  constexpr size_t kMaxBytes = 4096;  // what the child writes is a few dozen
  job.progress_read = unix_now();
  std::ifstream in(job.progress_file, std::ios::binary);
  if (!in) return false;
  std::string text(kMaxBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  const json p = json::parse(text, nullptr, false);
  // Anything else (a file of another program, cut short) is not progress: kept as it was.
  if (text.size() > kMaxBytes || !p.is_object() || !p.contains("stage") || !p["stage"].is_string() ||
      p["stage"].get<std::string>().size() > 32 || !p.contains("done") || !p["done"].is_number_unsigned() ||
      !p.contains("total") || !p["total"].is_number_unsigned() ||
      p["done"].get<uint64_t>() > p["total"].get<uint64_t>())
    return false;
  const auto quarter = [](const json& q) {
    const auto total = q["total"].get<uint64_t>();
    return total == 0
               ? 4
               : static_cast<int>(4.0 * static_cast<double>(q["done"].get<uint64_t>()) / static_cast<double>(total));
  };
  const bool news =
      job.progress.is_null() || job.progress["stage"] != p["stage"] || quarter(job.progress) != quarter(p);
  job.progress = {{"stage", p["stage"]}, {"done", p["done"]}, {"total", p["total"]}};
  return news;
}

void Exports::watch() {
  constexpr double kProgressEvery = 0.5;  // seconds between reads of a child's progress
  size_t finished = 0;
  for (auto& [n, job] : jobs_) {
    if (!job.child) {
      ++finished;
      continue;
    }
    for (const auto& exit : job.child->reap()) {
      job.state = exit.ok() ? "done" : "failed";
      if (!exit.ok())
        job.error = fmt::format("tide-worker {} {}: {}", job.kind, exit.describe(), last_error_line(job.log));
    }
    if (!job.child->all_ended()) {
      // A child that ended is reported once, below, with where it ended: no progress
      // event right before its end's.
      if (unix_now() - job.progress_read >= kProgressEvery && read_progress(job))
        bus_.publish(job.run, job.kind, job.to_json());
      continue;
    }
    job.child.reset();
    job.finished = unix_now();
    read_progress(job);  // where it ended: all of it, or where it failed
    std::error_code ec;
    fs::remove(job.progress_file, ec);
    fs::remove(job.progress_file + ".tmp", ec);
    if (job.state == "done")
      spdlog::info("run {}: {} {}", job.run, job.id, job.kind == "export" ? "wrote " + job.out : "found it sound");
    else
      spdlog::error("run {}: {} failed: {}", job.run, job.id, job.error);
    bus_.publish(job.run, job.kind, job.to_json());
  }
  // Forget the oldest finished ones.
  for (auto it = jobs_.begin(); finished > kFinishedExportsKept && it != jobs_.end();) {
    if (it->second.child) {
      ++it;
      continue;
    }
    it = jobs_.erase(it);
    --finished;
  }
}

void Exports::end() {
  for (auto& [n, job] : jobs_) {
    if (!job.child) continue;
    job.child.reset();  // SIGKILL: what it wrote is incomplete either way
    job.state = "failed";
    job.error = "the controller shut down";
    job.finished = unix_now();
    bus_.publish(job.run, job.kind, job.to_json());
  }
}

}  // namespace tide::ipc
