// What a step cost (internal): its time, throughput and MFU against a measured matmul
// peak, the memory this rank holds and the bytes it sent, into the step's metrics.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include <c10/core/Device.h>

#include "tide/engine/config.h"
#include "tide/engine/train/metrics.h"

namespace spdlog {
class logger;
}

namespace tide {

class Comm;
struct Distributed;
struct ParallelModel;

class StepMeter {
 public:
  // peak_flops > 0: the machine's matmul peak per rank, as given; 0: the stored
  // calibration's for this rank's threads on a CPU, else measured here.
  StepMeter(const RunConfig& cfg, const ParallelModel& pm, Distributed* dist, c10::Device device, double peak_flops,
            spdlog::logger& log);

  // What a step cost this rank, taken at its end: it is reported later, when read.
  struct StepCost {
    double seconds = 0;      // the host's time for it: the device's, as the host waits a step later
    int64_t comm_bytes = 0;  // sent during it
    // Where the time went: blocked on collectives and on the data loader during the
    // step, and held by checkpoint saves since the step before ended.
    double comm_seconds = 0, data_seconds = 0, checkpoint_seconds = 0;
    double ended = 0;  // Unix seconds, this host's clock
  };
  void start_step();
  void add_data_seconds(double s) { data_seconds_ += s; }
  void add_checkpoint_seconds(double s) { checkpoint_seconds_ += s; }
  StepCost end_step();
  // Fills m's time, throughput, MFU, memory and communication for a step of `tokens`
  // tokens (all ranks) that cost `cost`, `steps_left` before the end.
  void finish_step(StepMetrics& m, int64_t tokens, int64_t steps_left, const StepCost& cost);

 private:
  using Clock = std::chrono::steady_clock;
  std::vector<const Comm*> groups() const;  // this rank's process groups
  int64_t bytes_sent() const;
  double comm_wait_seconds() const;
  // The matmul peak, measured with products whose memory the run's peaks leave out.
  double probe_matmul_peak();
  // The peak `tide plan --calibrate` stored for a CPU rank of this many threads; 0: none.
  double stored_cpu_peak() const;

  const ParallelModel& pm_;
  Distributed* dist_;
  c10::Device device_;
  const char* device_kind_;  // for the matmul probe
  DType compute_;
  spdlog::logger& log_;
  double peak_;
  int reprobes_left_;
  // The memory peaks (MiB) before the last probe: the allocators' peaks restart after it.
  double host_peak_before_probe_mb_ = 0, device_peak_before_probe_mb_ = 0;
  double flops_per_token_;
  int world_;
  int64_t flat_bytes_, frozen_bytes_;
  int64_t comm_before_ = 0;
  double comm_wait_at_start_ = 0, data_seconds_ = 0, checkpoint_seconds_ = 0;
  double ema_step_ = -1;  // seconds, for the ETA
  Clock::time_point began_;
};

}  // namespace tide
