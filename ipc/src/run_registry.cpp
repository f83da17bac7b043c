#include "tide/ipc/run_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tide/engine/io/json_input.h"

namespace tide::ipc {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr const char* kStateNames[] = {"queued",     "starting",  "running", "paused", "stopping",
                                       "restarting", "completed", "stopped", "failed", "cancelled"};

void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", tmp.string()));
  }
  if (const int fd = ::open(tmp.c_str(), O_RDONLY); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  fs::rename(tmp, path);
}
}  // namespace

const char* state_name(RunState s) { return kStateNames[static_cast<int>(s)]; }

std::optional<RunState> state_from_name(const std::string& name) {
  for (int i = 0; i < static_cast<int>(std::size(kStateNames)); ++i)
    if (name == kStateNames[i]) return static_cast<RunState>(i);
  return std::nullopt;
}

bool is_finished(RunState s) {
  return s == RunState::completed || s == RunState::stopped || s == RunState::failed || s == RunState::cancelled;
}

bool has_workers(RunState s) { return !is_finished(s) && s != RunState::queued; }

json RunRecord::to_json() const {
  json j = {{"id", id},
            {"name", name},
            {"state", state_name(state)},
            {"priority", priority},
            {"seq", seq},
            {"workers", workers},
            {"recipe_source", recipe_source},
            {"overrides", overrides},
            {"live", live},
            {"workdir", workdir},
            {"idempotency_key", idempotency_key},
            {"attempt", attempt},
            {"restarts", restarts},
            {"max_restarts", max_restarts},
            {"heartbeat_timeout_s", heartbeat_timeout_s},
            {"resume", resume},
            {"total_steps", total_steps},
            {"last_step", last_step},
            {"final_loss", final_loss ? json(*final_loss) : json(nullptr)},
            {"error", error},
            {"scheduler", scheduler},
            {"layout", layout},
            {"submitted", submitted},
            {"started", started},
            {"finished", finished}};
  return j;
}

RunRecord RunRecord::from_json(const json& j) {
  RunRecord r;
  r.id = j.at("id").get<std::string>();
  r.name = j.value("name", r.id);
  const auto state = state_from_name(j.value("state", "queued"));
  if (!state) throw std::runtime_error(fmt::format("unknown state '{}'", j.value("state", "")));
  r.state = *state;
  r.priority = j.value("priority", int64_t{0});
  r.seq = j.value("seq", int64_t{0});
  r.workers = j.value("workers", 1);
  r.recipe_source = j.value("recipe_source", "");
  r.overrides = j.value("overrides", std::vector<std::string>{});
  r.live = j.value("live", json::object());
  r.workdir = j.value("workdir", "");
  r.idempotency_key = j.value("idempotency_key", "");
  r.attempt = j.value("attempt", int64_t{0});
  r.restarts = j.value("restarts", int64_t{0});
  r.max_restarts = j.value("max_restarts", int64_t{3});
  r.heartbeat_timeout_s = j.value("heartbeat_timeout_s", 60.0);
  r.resume = j.value("resume", false);
  r.total_steps = j.value("total_steps", int64_t{0});
  r.last_step = j.value("last_step", int64_t{0});
  if (j.contains("final_loss") && j["final_loss"].is_number()) r.final_loss = j["final_loss"].get<double>();
  r.error = j.value("error", "");
  if (j.contains("scheduler") && j["scheduler"].is_object()) r.scheduler = j["scheduler"];
  if (j.contains("layout") && j["layout"].is_object()) r.layout = j["layout"];
  r.submitted = j.value("submitted", 0.0);
  r.started = j.value("started", 0.0);
  r.finished = j.value("finished", 0.0);
  return r;
}

RunRegistry::RunRegistry(std::string state_dir) : root_(std::move(state_dir)) {
  fs::create_directories(fs::path(root_) / "runs");
  for (const auto& entry : fs::directory_iterator(fs::path(root_) / "runs")) {
    const fs::path file = entry.path() / "run.json";
    if (!fs::exists(file)) continue;
    try {
      RunRecord r = RunRecord::from_json(read_json_file(file.string()));
      seq_ = std::max(seq_, r.seq);
      const auto dash = r.id.rfind('-');
      if (dash != std::string::npos) {
        try {
          counter_ = std::max<int64_t>(counter_, std::stoll(r.id.substr(dash + 1)));
        } catch (const std::exception&) {
        }
      }
      runs_[r.id] = std::move(r);
    } catch (const std::exception& e) {
      spdlog::error("run registry: skipping {}: {}", file.string(), e.what());
    }
  }
}

std::string RunRegistry::run_dir(const std::string& id) const { return (fs::path(root_) / "runs" / id).string(); }

std::string RunRegistry::allocate(const std::string& name) {
  std::string id;
  do id = fmt::format("{}-{}", name, ++counter_);
  while (runs_.count(id) || fs::exists(run_dir(id)));
  fs::create_directories(run_dir(id));
  return id;
}

void RunRegistry::save(const RunRecord& r) {
  write_atomically(fs::path(run_dir(r.id)) / "run.json", r.to_json().dump(2) + "\n");
  runs_[r.id] = r;
}

RunRecord* RunRegistry::find(const std::string& id) {
  const auto it = runs_.find(id);
  return it == runs_.end() ? nullptr : &it->second;
}

const RunRecord* RunRegistry::find(const std::string& id) const {
  const auto it = runs_.find(id);
  return it == runs_.end() ? nullptr : &it->second;
}

RunRecord* RunRegistry::find_by_key(const std::string& key) {
  if (key.empty()) return nullptr;
  for (auto& [id, r] : runs_)
    if (r.idempotency_key == key) return &r;
  return nullptr;
}

std::vector<RunRecord*> RunRegistry::all() {
  std::vector<RunRecord*> out;
  for (auto& [id, r] : runs_) out.push_back(&r);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->seq < b->seq; });
  return out;
}

}  // namespace tide::ipc
