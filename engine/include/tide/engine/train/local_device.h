// The local machine's CPU as a planner device (plan/cluster.h): measured, not assumed.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tide/engine/plan/cluster.h"

namespace tide {

// Probes this CPU with `threads` intra-op threads: the fp32 GEMM peak, and the matmul and
// elementwise rates that best explain the forward and backward times of three small tide
// LLaMAs as the planner's time model counts their work. Memory: the machine's RAM. A few
// seconds.
DeviceSpec probe_local_cpu(int threads);

// `tide plan --calibrate`: the probe at one thread and at all cores, and the loopback
// collective probe (two ranks meeting at 127.0.0.1:`rendezvous_port`), as stored JSON.
nlohmann::json calibrate_local_cpu(int rendezvous_port);

// The CPU as `ranks` processes sharing it see it, each with cores / ranks threads (at
// least one): from the calibration stored at `calibration_path` (default_calibration_path(),
// cluster.h) when it has one, else probed now (logged).
DeviceSpec local_cpu_device(const std::string& calibration_path, int ranks);

// This machine's GPU 0 as a planner device: the table's entry (cluster.h) whose memory is
// nearest the device's, with the device's own memory. The same answer on every rank of a
// node (nothing is timed). Throws std::runtime_error where LibTorch sees no CUDA device.
DeviceSpec local_cuda_device();

}  // namespace tide
