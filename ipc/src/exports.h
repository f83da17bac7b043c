// A run's checkpoints as the controller sees them (listed from disk), and exports of
// them to Hugging Face files. An export needs LibTorch, which the controller never
// loads, so it runs `tide-worker export` as a child process, watched like a worker.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "event_bus.h"
#include "run_book.h"
#include "tide/ipc/controller.h"
#include "tide/ipc/worker_group.h"

namespace tide::ipc {

// One export, kept in memory: a controller's exports end with it.
struct ExportJob {
  std::string id, run, checkpoint, out, dtype, log;
  int64_t step = 0;
  std::string state = "running";  // running, done, failed
  std::string error;
  double started = 0, finished = 0;
  std::unique_ptr<WorkerGroup> child;
  nlohmann::json to_json() const;
};

class Exports {
 public:
  Exports(const ControllerOptions& opt, RunBook& runs, EventBus& bus);

  // The requests (docs/protocol.md): checkpoints, export, exports.
  nlohmann::json checkpoints_of(const nlohmann::json& body);
  nlohmann::json start(const nlohmann::json& body);
  nlohmann::json list(const nlohmann::json& body);
  // Children that ended: their exports done or failed, published.
  void watch();
  // The controller stops: running exports are killed and reported failed.
  void end();

 private:
  const ControllerOptions& opt_;
  RunBook& runs_;
  EventBus& bus_;
  std::map<int64_t, ExportJob> jobs_;  // by number, oldest first
};

}  // namespace tide::ipc
