// Starts the worker processes of one node and watches them: when one fails, the others
// are stopped and the failure is reported by rank.
#pragma once

#include "tide/ipc/worker_group.h"

namespace tide::worker {

// Runs `spec` to the end; returns the exit status for
// the launcher: 0 when every worker succeeded.
int launch_workers(ipc::WorkerSpec spec);

}  // namespace tide::worker
