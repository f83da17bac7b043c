// A worker's connection to its controller (docs/protocol.md, "Worker link"): a DEALER
// socket owned by one background thread, which sends a heartbeat every second, the
// messages queued by the training thread, and keeps the commands the controller sent
// to rank 0 until the trainer takes them at a step boundary, or hands the controller's
// answer to a question (an anomaly for the recipe's policy) to the thread that asked.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tide/ipc/curve.h"

namespace tide::ipc {

class Wakeup;

struct WorkerIdentity {
  std::string endpoint;  // the controller's worker socket
  std::string key_file;  // over TCP: the run's CURVE keys (write_worker_link_keys)
  std::string run;
  int64_t attempt = 0;
  int rank = 0;
};

// From TIDE_CONTROLLER, TIDE_CONTROLLER_KEY_FILE, TIDE_RUN_ID and TIDE_ATTEMPT, for the
// rank the launcher's variables give (launch_env.h); nullopt when not under a controller.
std::optional<WorkerIdentity> worker_identity_from_environment(int rank);

class WorkerLink {
 public:
  // Throws when the key file cannot be read.
  explicit WorkerLink(WorkerIdentity id);
  // Sends what is queued (up to a second), then closes.
  ~WorkerLink();
  WorkerLink(const WorkerLink&) = delete;
  WorkerLink& operator=(const WorkerLink&) = delete;

  // Thread-safe. type: "metrics", "event", "log", "done"; body: its object.
  void send(const std::string& type, nlohmann::json body);
  // The commands received since the last call, as a JSON array text ("" for none).
  std::string take_commands();
  // Sends `type` with `body` and a fresh "query" number, then waits up to `timeout` for
  // the controller's answer to that query; nullopt when none came in time.
  std::optional<nlohmann::json> ask(const std::string& type, nlohmann::json body, std::chrono::milliseconds timeout);

 private:
  void loop();

  WorkerIdentity id_;
  std::optional<WorkerLinkKeys> keys_;
  std::mutex mu_;
  std::deque<std::string> outgoing_;
  nlohmann::json commands_ = nlohmann::json::array();
  std::condition_variable answered_;
  std::map<int64_t, nlohmann::json> answers_;  // by query number
  int64_t next_query_ = 1;
  std::atomic<bool> stop_{false};
  // Written by send(): wakes the link's thread from its poll, so that a message goes out
  // at once rather than at the poll's next timeout.
  std::unique_ptr<Wakeup> wake_;
  std::thread thread_;
};

}  // namespace tide::ipc
