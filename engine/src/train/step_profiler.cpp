#include "step_profiler.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <kineto/ActivityType.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include "profile_summary.h"

namespace tide {
namespace {

namespace kineto = torch::autograd::profiler;
using ProfilerActivity = torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// Rows of each table in the run log; the summary file has more.
constexpr size_t kLogRows = 10, kFileRows = 40;

std::vector<ProfiledEvent> profiled_events(const kineto::ProfilerResult& result) {
  using libkineto::ActivityType;
  std::vector<ProfiledEvent> out;
  for (const kineto::KinetoEvent& e : result.events()) {
    if (e.isHiddenEvent()) continue;
    ProfiledEvent p;
    switch (static_cast<ActivityType>(e.activityType())) {
      case ActivityType::CPU_OP:
      case ActivityType::CUDA_RUNTIME:
      case ActivityType::CUDA_DRIVER: p.kind = ProfiledEvent::Kind::HostOp; break;
      case ActivityType::USER_ANNOTATION: p.kind = ProfiledEvent::Kind::Annotation; break;
      case ActivityType::CONCURRENT_KERNEL:
      case ActivityType::GPU_MEMCPY:
      case ActivityType::GPU_MEMSET: p.kind = ProfiledEvent::Kind::Device; break;
      default: continue;  // memory records, correlations, the profiler's own overhead
    }
    p.name = e.name();
    p.thread = p.kind == ProfiledEvent::Kind::Device ? static_cast<uint64_t>(e.deviceResourceId()) : e.startThreadId();
    p.start_ns = e.startNs();
    p.end_ns = e.endNs();
    p.flops = e.flops();
    // A kernel names the operator (or annotation) it was launched in by that one's id,
    // as PyTorch's own profiler tables join them; the runtime's calls have ids of
    // another kind (CUPTI's), which must not be taken for an operator's.
    if (e.activityType() == static_cast<uint8_t>(ActivityType::CPU_OP) ||
        e.activityType() == static_cast<uint8_t>(ActivityType::USER_ANNOTATION))
      p.correlation = e.correlationId();
    if (p.kind == ProfiledEvent::Kind::Device) p.launched_by = e.linkedCorrelationId();
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

StepProfiler::StepProfiler(const RunConfig& cfg, int rank, c10::Device device, const std::filesystem::path& run_dir,
                           std::shared_ptr<spdlog::logger> log)
    : cfg_(cfg),
      rank_(rank),
      device_(device),
      dir_(run_dir / "profile"),
      log_(std::move(log)),
      seen_start_step_(cfg.profile.start_step) {
  const auto& ranks = cfg.profile.ranks;
  chosen_ = ranks.empty() || std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
  // On a host without a GPU, Kineto in a CUDA build of LibTorch reports, as an error,
  // that it found none, and logs each start and stop. On the CPU its log has nothing a
  // run needs: silenced (it reads the level when first used), unless the user set one.
  // On a GPU it stays: CUPTI's complaints (permissions, a driver too old) matter there.
  if (!device.is_cuda()) setenv("KINETO_LOG_LEVEL", "6", /*overwrite=*/0);
}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  step_scope_.reset();
  try {
    kineto::disableProfiler();
  } catch (const std::exception& e) {
    log_->warn("profile: stopping the profiler failed: {}", e.what());
  }
}

void StepProfiler::begin_step(int64_t step) {
  const int64_t n = step + 1, wanted = cfg_.profile.start_step;
  const bool changed_live = wanted != seen_start_step_;
  seen_start_step_ = wanted;
  if (!recording_) {
    // A live change to a step already begun means "from the next step": a resumed run
    // past its recipe's start_step records nothing.
    if (!chosen_ || wanted == 0 || !(n == wanted || (changed_live && wanted < n))) return;
    start(n);
    if (!recording_) return;
  }
  step_scope_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_scope_->isActive())
    at::detail::record_function_with_scope(*step_scope_, "ProfilerStep#" + std::to_string(n),
                                           c10::ArrayRef<const c10::IValue>{});
}

void StepProfiler::end_step(int64_t step) {
  if (!recording_) return;
  step_scope_.reset();  // its end is the step's
  through_ = step + 1;
  if (through_ >= last_) write(through_);
}

void StepProfiler::finish() {
  if (recording_) write(through_);
}

void StepProfiler::start(int64_t first) {
  if (torch::profiler::impl::profilerEnabled()) {
    log_->warn(
        "profile: LibTorch's profiler is on already in this process (the embedding program's?): step {} "
        "is not recorded",
        first);
    return;
  }
  const ProfilerConfig config(ProfilerState::KINETO, cfg_.profile.shapes, cfg_.profile.memory, /*with_stack=*/false,
                              /*with_flops=*/true);
  std::set<ProfilerActivity> activities{ProfilerActivity::CPU};
  if (device_.is_cuda()) activities.insert(ProfilerActivity::CUDA);
  kineto::prepareProfiler(config, activities);
  kineto::enableProfiler(config, activities);
  recording_ = true;
  first_ = through_ = first;
  last_ = first + cfg_.profile.steps - 1;
  log_->info("profile: recording steps {}-{} on rank {}", first_, last_, rank_);
}

void StepProfiler::write(int64_t through) {
  // A step's kernels may still run: they belong to it.
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  recording_ = false;
  const std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  const std::string stem = fmt::format("steps-{}-{}-rank-{}", first_, through, rank_);
  std::filesystem::create_directories(dir_);
  const std::filesystem::path trace = dir_ / (stem + ".trace.json"), summary_path = dir_ / (stem + ".summary.txt");
  result->save(trace.string());
  const ProfileSummary summary = summarize_profile(profiled_events(*result));
  const int64_t steps = through - first_ + 1;
  std::ofstream(summary_path, std::ios::trunc) << format_profile_summary(summary, steps, kFileRows);
  log_->info("profile: steps {}-{} written to {} and {}", first_, through, trace.string(), summary_path.string());
  std::istringstream lines(format_profile_summary(summary, steps, kLogRows));
  for (std::string line; std::getline(lines, line);) log_->info("profile: {}", line);
}

}  // namespace tide
