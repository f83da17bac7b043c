// The controller's state, shared by controller.cpp (sockets, loop, events),
// requests.cpp (client requests) and supervisor.cpp (worker groups).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/common.h>
#include <zmq.hpp>

#include "tide/engine/config.h"
#include "tide/engine/run_layout.h"
#include "tide/ipc/controller.h"
#include "tide/ipc/curve.h"
#include "tide/ipc/protocol.h"
#include "tide/ipc/run_registry.h"
#include "tide/ipc/worker_group.h"
#include "tide/scripting/policy.h"

namespace tide::ipc {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// What the controller holds for a run while it has workers.
struct ActiveRun {
  std::unique_ptr<WorkerGroup> group;
  std::string rank0;  // routing id of rank 0's link, once it said hello
  std::map<int, Clock::time_point> last_seen;
  Clock::time_point started;
  std::vector<std::string> gpus;  // the devices its workers see (a cuda run)
  BatchLayout batch;              // how the group cuts a step's batch, which a live change must fit
  json pending = json::array();  // commands for rank 0 not yet delivered
  bool stop_requested = false, cancel_requested = false;
  bool ending = false;  // the group is being ended
  std::string fault;    // why it is being ended after a failure
  std::optional<json> done;  // rank 0's result
  std::string worker_error;  // the first error a worker reported
};

// A checkpoint being exported to Hugging Face files by a `tide ckpt export` child (the
// controller has no LibTorch). Kept in memory: a controller's exports end with it.
struct ExportJob {
  std::string id, run, checkpoint, out, dtype, log;
  int64_t step = 0;
  std::string state = "running";  // running, done, failed
  std::string error;
  double started = 0, finished = 0;
  std::unique_ptr<WorkerGroup> child;
  json to_json() const;
};

struct Controller::Impl {
  ControllerOptions opt;
  zmq::context_t ctx{1};
  zmq::socket_t commands{ctx, zmq::socket_type::router};
  zmq::socket_t events{ctx, zmq::socket_type::xpub};
  zmq::socket_t workers{ctx, zmq::socket_type::router};
  zmq::socket_t zap{ctx, zmq::socket_type::rep};  // ZAP handler: CURVE clients by key
  std::optional<CurveKeyPair> curve;
  std::map<std::string, Role> allowed;
  std::vector<std::string> command_eps, event_eps;
  std::string worker_ep;
  std::atomic<bool> stopping{false};
  std::atomic<bool> hurry{false};  // stop without waiting for the runs' checkpoints
  int state_lock = -1;  // flock on <state>/controller.lock, held for the controller's life
  std::string epoch;    // this controller instance, in every event
  std::unique_ptr<RunRegistry> registry;
  std::map<std::string, ActiveRun> active;
  std::map<std::string, RunConfig> configs;  // resolved recipes of unfinished runs
  std::map<std::string, int64_t> seq;        // per-run event sequence numbers
  std::map<std::string, json> last_metrics;
  // The recipe policies of unfinished runs (null: the recipe has none). They outlive a
  // worker group, so what a policy keeps in Lua survives a restart.
  std::map<std::string, std::unique_ptr<RunPolicies>> policies;
  std::map<int64_t, ExportJob> exports;  // by number, oldest first

  explicit Impl(ControllerOptions o);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // controller.cpp
  void serve_commands();
  void serve_subscriptions();
  void serve_zap();
  void bind_endpoints();
  void publish(const std::string& run, const std::string& kind, json body, bool snapshot = false);
  void set_state(RunRecord& r, RunState s, json extra = json::object());
  // A line of the controller's about a run, where the run's own lines are: appended to
  // its train.log and published as a log event (the controller's log has it too).
  void run_log(const std::string& run, spdlog::level::level_enum level, const std::string& line);
  void snapshot(const std::string& prefix);

  // requests.cpp
  json handle(const Request& req);
  json submit(const json& body);
  json control(const std::string& op, const json& body, const json& request_id);
  json set(const json& body, const json& request_id);
  json status_of(const RunRecord& r);
  json info();
  RunRecord& find_run(const json& body);
  const RunConfig& config_of(const RunRecord& r);
  // A live change the run took: the controller's view of its recipe, and the record a
  // restart replays.
  void record_live_change(RunRecord& r, const json& values);

  // exports.cpp
  json checkpoints_of(const json& body);
  json start_export(const json& body);
  json exports_of(const json& body);
  void watch_exports();
  void end_exports();

  // policies.cpp
  RunPolicies* policies_of(const RunRecord& r);
  void step_policy(RunRecord& r, const json& metrics);
  void anomaly_policy(RunRecord& r, const std::string& worker, const json& question);

  // supervisor.cpp
  void serve_workers();
  void supervise();
  void schedule();
  void launch(RunRecord& r);
  void deliver(const std::string& run);
  void finish_group(RunRecord& r, ActiveRun& a);
  void shutdown();
  int slots_in_use() const;              // CPU slots
  std::vector<std::string> free_gpus() const;
  bool wants_gpus(const RunRecord& r);  // the recipe says device = "cuda"
};

double unix_now();

}  // namespace tide::ipc
