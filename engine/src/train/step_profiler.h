// LibTorch's profiler (Kineto) around the steps a recipe's `profile` section names
// (internal; docs/profiling.md). Each recording rank writes
// run-dir/profile/steps-A-B-rank-R.trace.json, a Chrome trace (Perfetto, chrome://tracing,
// Holistic Trace Analysis), and beside it steps-A-B-rank-R.summary.txt, where the time
// went (profile_summary.h), which the run log shows too. Each step is a ProfilerStep#N
// scope, the name torch.profiler gives its steps, so tools that split a trace by step work.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include <c10/core/Device.h>

#include "tide/engine/config.h"

namespace at {
class RecordFunction;
}
namespace spdlog {
class logger;
}

namespace tide {

class StepProfiler {
 public:
  // `cfg` follows live changes: a recording starts at the step cfg.profile.start_step
  // names, or, where a live change set it to a step already begun, at the next step
  // (check_supported_layout checked profile.ranks).
  StepProfiler(const RunConfig& cfg, int rank, c10::Device device, const std::filesystem::path& run_dir,
               std::shared_ptr<spdlog::logger> log);
  ~StepProfiler();  // a recording left open by an error is dropped
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around 0-based step `step`'s work on this rank.
  void begin_step(int64_t step);
  void end_step(int64_t step);
  // The run ended (its last step, or stopped) inside a recording: the steps recorded so
  // far are written.
  void finish();

 private:
  void start(int64_t first);
  void write(int64_t through);

  const RunConfig& cfg_;
  int rank_;
  bool chosen_;
  c10::Device device_;
  std::filesystem::path dir_;
  std::shared_ptr<spdlog::logger> log_;
  int64_t seen_start_step_;  // profile.start_step at the last step's beginning
  bool recording_ = false;
  int64_t first_ = 0, last_ = 0, through_ = 0;  // 1-based steps
  std::unique_ptr<at::RecordFunction> step_scope_;
};

}  // namespace tide
