// A run's checkpoints as the controller sees them (listed from disk), exports of them to
// Hugging Face files and verifications of their files against their manifests. An export
// needs LibTorch, which the controller never loads, and a verification reads every byte
// of a checkpoint, which the controller's thread must not wait on: each runs as a child
// process (`tide-worker export`, `tide-worker verify`), watched like a worker.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "event_bus.h"
#include "run_book.h"
#include "tide/ipc/controller.h"
#include "tide/ipc/worker_group.h"

namespace tide::ipc {

// One export or verification, kept in memory: a controller's jobs end with it.
struct ExportJob {
  std::string kind;                                  // "export" or "verify": its request, its event and its id's prefix
  std::string id, run, checkpoint, out, dtype, log;  // out and dtype: an export's
  int64_t step = 0;
  bool adapter = false;           // an export of a LoRA run's adapters alone (PEFT's directory)
  std::string state = "running";  // running, done, failed
  std::string error;
  double started = 0, finished = 0;
  std::unique_ptr<WorkerGroup> child;
  // Where the child stands, as its progress file last said ({"stage", "done", "total"}
  // in bytes; null before it said anything); read at most twice a second.
  std::string progress_file;
  nlohmann::json progress;
  double progress_read = 0;
  nlohmann::json to_json() const;
};

class Exports {
 public:
  Exports(const ControllerOptions& opt, RunBook& runs, EventBus& bus);

  // The requests (docs/protocol.md): checkpoints, export, exports, verify.
  nlohmann::json checkpoints_of(const nlohmann::json& body);
  nlohmann::json start(const nlohmann::json& body);
  nlohmann::json verify(const nlohmann::json& body);
  nlohmann::json list(const nlohmann::json& body);
  // Children that ended: their exports done or failed, published.
  void watch();
  // The controller stops: running exports are killed and reported failed.
  void end();

 private:
  // The committed checkpoint of `step` (-1: the newest) of run r; bad_request naming it
  // when there is none.
  struct Chosen {
    int64_t step;
    std::string path;
  };
  Chosen choose(const RunRecord& r, int64_t step) const;
  // Starts `tide-worker <args>` for the job and publishes it; throws internal when it
  // cannot start.
  nlohmann::json launch(ExportJob job, std::vector<std::string> args);
  // Reads the job's progress file; true when its stage or its quarter changed (an event
  // is worth publishing).
  bool read_progress(ExportJob& job) const;

  const ControllerOptions& opt_;
  RunBook& runs_;
  EventBus& bus_;
  std::map<int64_t, ExportJob> jobs_;  // by number, oldest first
};

}  // namespace tide::ipc
