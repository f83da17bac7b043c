// A worker started by a controller (tided or an embedded engine): its link to the
// controller, wired into the trainer's hooks.
#pragma once

#include <memory>

#include "tide/engine/train/trainer.h"
#include "tide/ipc/worker_link.h"

namespace tide::worker {

// When the environment names a controller (TIDE_CONTROLLER), connects to it and sets
// the hooks: every rank heartbeats and takes part in live control; rank 0 also sends
// metrics, events and the run log's lines, and receives the commands. With
// `ask_anomaly_policy` (the recipe has on_anomaly), rank 0 asks the controller, which
// runs the policy. `rank`: this process's, as its launcher's variables give it. Null
// otherwise.
std::unique_ptr<ipc::WorkerLink> attach_controller(TrainHooks& hooks, bool ask_anomaly_policy, int rank);

// Rank 0's last words to the controller: the result, or why training failed.
void report_result(ipc::WorkerLink* link, const TrainResult& result);
void report_failure(ipc::WorkerLink* link, const std::string& message);

}  // namespace tide::worker
