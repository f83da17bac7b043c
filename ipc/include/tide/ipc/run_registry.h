// The controller's runs, one directory each under <state>/runs/<id>/ with run.json,
// rewritten atomically on every change, so that a restarted daemon finds its queue and
// the runs it must resume.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tide::ipc {

enum class RunState { queued, starting, running, paused, stopping, restarting, completed, stopped, failed, cancelled };
const char* state_name(RunState s);
std::optional<RunState> state_from_name(const std::string& name);
bool is_finished(RunState s);  // completed, stopped, failed, cancelled
bool has_workers(RunState s);  // starting, running, paused, stopping, restarting

struct RunRecord {
  std::string id;    // "<recipe name>-<n>"
  std::string name;  // the recipe's name
  RunState state = RunState::queued;
  int64_t priority = 0;  // higher first; FIFO within a priority (seq)
  int64_t seq = 0;       // submission order
  int workers = 1;
  std::string recipe_source;  // where the text came from (file, bundled name, "inline")
  std::vector<std::string> overrides;  // "a.b=value" given at submit
  nlohmann::json live = nlohmann::json::object();  // live changes so far: field → value
  std::string workdir;  // relative recipe paths resolve here
  std::string idempotency_key;
  int64_t attempt = 0;   // worker groups started so far
  int64_t restarts = 0;  // after faults
  int64_t max_restarts = 3;
  double heartbeat_timeout_s = 60;
  bool resume = false;  // the next start continues from the latest checkpoint
  int64_t total_steps = 0, last_step = 0;
  std::optional<double> final_loss;
  std::string error;
  // The scheduler's job while it runs under one, and after: {"slurm_job": "12", "state":
  // "RUNNING", "nodes": "node07"}; null for local workers.
  nlohmann::json scheduler;
  // How the run is laid out, from its recipe at submit, for lists and dashboards:
  // {"dp", "tp", "pp", "zero", "offload", "device", "micro_batch", "global_batch", "seq_len"}.
  nlohmann::json layout = nlohmann::json::object();
  double submitted = 0, started = 0, finished = 0;  // Unix seconds

  nlohmann::json to_json() const;
  static RunRecord from_json(const nlohmann::json& j);
};

class RunRegistry {
 public:
  // Loads every <root>/runs/*/run.json (a broken one is logged and skipped).
  explicit RunRegistry(std::string state_dir);

  const std::string& state_dir() const { return root_; }
  std::string run_dir(const std::string& id) const;
  // A new id for a run of this recipe name, and its directory, created.
  std::string allocate(const std::string& name);
  void save(const RunRecord& r);  // atomic; throws on I/O errors
  RunRecord* find(const std::string& id);
  const RunRecord* find(const std::string& id) const;
  RunRecord* find_by_key(const std::string& idempotency_key);
  std::vector<RunRecord*> all();  // in submission order
  int64_t next_seq() { return ++seq_; }

 private:
  std::string root_;
  std::map<std::string, RunRecord> runs_;
  int64_t seq_ = 0;
  int64_t counter_ = 0;
};

}  // namespace tide::ipc
