// The runs' worker groups: starting them when slots are free (highest priority first),
// the worker socket every rank's link talks to, heartbeats and exits, restarts from the
// latest checkpoint, the commands queued for rank 0, and the end of them all when the
// controller stops.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "policy_host.h"
#include "run_book.h"
#include "run_executor.h"
#include "tide/engine/run_layout.h"
#include "tide/ipc/controller.h"
#include "tide/ipc/curve.h"

namespace tide::ipc {

using Clock = std::chrono::steady_clock;

// What the controller holds for a run while it has workers.
struct ActiveRun {
  std::unique_ptr<RunExecutor> executor;
  std::string worker_key;  // the public key its ranks use on the TCP worker socket, if any
  std::string rank0;  // routing id of rank 0's link, once it said hello
  std::map<int, Clock::time_point> last_seen;
  Clock::time_point started;
  std::vector<std::string> gpus;                     // the devices its workers see (a cuda run)
  BatchLayout batch;                                 // how the group cuts a step's batch, which a live change must fit
  nlohmann::json pending = nlohmann::json::array();  // commands for rank 0 not yet delivered
  bool stop_requested = false, cancel_requested = false;
  bool ending = false;                 // the group is being ended
  std::string fault;                   // why it is being ended after a failure
  std::optional<nlohmann::json> done;  // rank 0's result
  std::string worker_error;            // the first error a worker reported
};

class Supervisor {
 public:
  Supervisor(const ControllerOptions& opt, zmq::context_t& ctx, RunBook& runs, PolicyHost& policies, EventBus& bus);

  zmq::socket_t& socket() { return workers_; }
  void serve_workers();  // what the links sent
  void supervise();      // exits, heartbeats, groups that ended
  void schedule();       // queued runs onto free slots

  // The run's group, when it has one.
  ActiveRun* find(const std::string& run);
  // A command for rank 0 (pause, resume, stop, checkpoint, set), applied at its next
  // step boundary; sent once rank 0's link has said hello.
  void command(const std::string& run, nlohmann::json command);
  // Ends the run's workers; the run is cancelled once they have.
  void cancel(const std::string& run);
  // The pids of its workers (or its scheduler's job) and its devices, into a status reply.
  void describe(const std::string& run, nlohmann::json& status) const;
  // The run whose ranks use this public key (Z85) on the TCP worker socket: the
  // controller's ZAP handler admits only these.
  std::optional<std::string> run_of_worker_key(const std::string& key) const;
  static constexpr const char* kWorkerZapDomain = "tide-workers";

  int slots_in_use() const;  // CPU slots
  std::vector<std::string> free_gpus() const;

  // Each training run saves a checkpoint (within shutdown_timeout_s, or until `hurry`),
  // its workers end, and it is queued to resume under the next controller.
  void shutdown(const std::atomic<bool>& hurry);

 private:
  void launch(RunRecord& r);
  std::unique_ptr<RunExecutor> start_slurm_job(RunRecord& r, const WorkerSpec& spec, ActiveRun& a);
  // One message of a rank of an active run's current attempt (serve_workers checked its
  // route and shape); throws when its body is not what its type needs.
  void serve_worker_message(RunRecord& r, ActiveRun& run, const std::string& identity, int rank,
                            const nlohmann::json& msg);
  void deliver(const std::string& run);
  void on_event(RunRecord& r, const nlohmann::json& body);
  void finish_group(RunRecord& r, ActiveRun& a);

  const ControllerOptions& opt_;
  RunBook& runs_;
  PolicyHost& policies_;
  EventBus& bus_;
  zmq::socket_t workers_;
  std::string endpoint_;                 // ipc, for local workers
  std::string tcp_endpoint_;             // what ranks on other hosts connect to (Slurm runs)
  std::optional<CurveKeyPair> tcp_key_;  // the TCP worker socket's own, made at each start
  std::map<std::string, ActiveRun> active_;
};

}  // namespace tide::ipc
