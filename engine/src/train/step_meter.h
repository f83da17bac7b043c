// What a step cost (internal): its time, throughput and MFU against a measured matmul
// peak, the memory this rank holds and the bytes it sent, into the step's metrics.
#pragma once

#include <chrono>
#include <cstdint>

#include <c10/core/Device.h>

#include "tide/engine/config.h"
#include "tide/engine/train/metrics.h"

namespace spdlog {
class logger;
}

namespace tide {

struct Distributed;
struct ParallelModel;

class StepMeter {
 public:
  // peak_flops > 0: the machine's matmul peak per rank, as given; 0: measured here.
  StepMeter(const RunConfig& cfg, const ParallelModel& pm, Distributed* dist, c10::Device device, double peak_flops,
            spdlog::logger& log);

  // What a step cost this rank, taken at its end: it is reported later, when read.
  struct StepCost {
    double seconds = 0;      // the host's time for it: the device's, as the host waits a step later
    int64_t comm_bytes = 0;  // sent during it
  };
  void start_step() { began_ = Clock::now(); }
  StepCost end_step();
  // Fills m's time, throughput, MFU, memory and communication for a step of `tokens`
  // tokens (all ranks) that cost `cost`, `steps_left` before the end.
  void finish_step(StepMetrics& m, int64_t tokens, int64_t steps_left, const StepCost& cost);

 private:
  using Clock = std::chrono::steady_clock;
  int64_t bytes_sent() const;

  const ParallelModel& pm_;
  Distributed* dist_;
  c10::Device device_;
  const char* device_kind_;  // for the matmul probe
  DType compute_;
  spdlog::logger& log_;
  double peak_;
  int reprobes_left_;
  double flops_per_token_;
  int world_;
  int64_t flat_bytes_;
  int64_t comm_before_ = 0;
  double ema_step_ = -1;  // seconds, for the ETA
  Clock::time_point began_;
};

}  // namespace tide
