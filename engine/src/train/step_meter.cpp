#include "step_meter.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/data_parallel.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/parallelize.h"
#include "tide/engine/plan/cluster.h"
#include "tide/engine/train/flops.h"
#include "tide/engine/train/runtime.h"
#include "tide/engine/train/tensor_memory.h"

namespace tide {

namespace {
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// LoRA's frozen base where the model holds it whole (not sharded by ZeRO-3, which counts
// its pieces), in the dtypes it is held in (parallelize.h).
int64_t held_frozen_bytes(const ParallelModel& pm) {
  if (pm.frozen) return 0;
  int64_t bytes = 0;
  for (const auto& p : pm.model->parameters())
    if (!p.requires_grad()) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}
}  // namespace

StepMeter::StepMeter(const RunConfig& cfg, const ParallelModel& pm, Distributed* dist, c10::Device device,
                     double peak_flops, spdlog::logger& log)
    : pm_(pm),
      dist_(dist),
      device_(device),
      device_kind_(device.is_cuda() ? "cuda" : "cpu"),
      compute_(cfg.precision.compute),
      log_(log),
      peak_(peak_flops),
      reprobes_left_(peak_flops > 0 ? 0 : 3),
      flops_per_token_(train_flops_per_token(cfg.model, cfg.data.seq_len)),
      world_(dist ? dist->world->size() : 1),
      flat_bytes_(pm.flat->numel() * static_cast<int64_t>(sizeof(float))),
      frozen_bytes_(held_frozen_bytes(pm)) {
  const char* source = "given";
  if (peak_ <= 0) {
    peak_ = stored_cpu_peak();
    source = "as tide plan --calibrate stored it";
  }
  if (peak_ <= 0) {
    peak_ = probe_matmul_peak();
    source = "measured";
  }
  log_.info("matmul peak {:.1f} GFLOP/s ({}); {:.3g} FLOPs per token", peak_ / 1e9, source, flops_per_token_);
}

double StepMeter::stored_cpu_peak() const {
  // The probe takes about a second at every start (a 2048² product at every thread count
  // it needs to reach its peak); a machine calibrated for ranks of this many threads has
  // the figure. A corrupt calibration is the planner's to report: probed here.
  if (!device_.is_cpu() || (compute_ != DType::Float32 && compute_ != DType::BFloat16)) return 0;
  try {
    return stored_matmul_peak(default_calibration_path(), at::get_num_threads(), compute_ == DType::BFloat16)
        .value_or(0.0);
  } catch (const std::exception& e) {
    log_.warn("ignoring the calibration {}: {}", default_calibration_path(), e.what());
    return 0;
  }
}

double StepMeter::probe_matmul_peak() {
  // The probe's operands (three 2048² fp32 products on the CPU, 8192² on a GPU: 48 MiB
  // and 384 MiB to 768 MiB) would otherwise be a small run's peak.
  host_peak_before_probe_mb_ = std::max(host_peak_before_probe_mb_, mib(peak_host_tensor_bytes()));
  device_peak_before_probe_mb_ = std::max(device_peak_before_probe_mb_, peak_device_mb(device_));
  const double flops = measure_matmul_peak(device_kind_, compute_);
  reset_peak_host_tensor_bytes();
  reset_peak_device_memory(device_);
  return flops;
}

std::vector<const Comm*> StepMeter::groups() const {
  std::vector<const Comm*> out;
  if (dist_)
    for (const auto* c : {dist_->dp.get(), dist_->tp.get(), dist_->pp.get(), dist_->cp.get(), dist_->dp_cp.get(),
                          dist_->ep.get(), dist_->expert_replicas.get(), dist_->embedding.get()})
      if (c) out.push_back(c);
  return out;
}

int64_t StepMeter::bytes_sent() const {
  int64_t total = 0;
  for (const Comm* c : groups()) total += c->bytes_sent();
  return total;
}

double StepMeter::comm_wait_seconds() const {
  double total = 0;
  for (const Comm* c : groups()) total += c->wait_seconds();
  return total;
}

void StepMeter::start_step() {
  began_ = Clock::now();
  comm_wait_at_start_ = comm_wait_seconds();  // not the waits of evaluations and saves between steps
}

StepMeter::StepCost StepMeter::end_step() {
  StepCost cost;
  cost.seconds = std::chrono::duration<double>(Clock::now() - began_).count();
  cost.ended = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const int64_t sent = bytes_sent();
  cost.comm_bytes = sent - comm_before_;
  comm_before_ = sent;
  cost.comm_seconds = comm_wait_seconds() - comm_wait_at_start_;
  cost.data_seconds = data_seconds_;
  cost.checkpoint_seconds = checkpoint_seconds_;
  data_seconds_ = checkpoint_seconds_ = 0;
  return cost;
}

void StepMeter::finish_step(StepMetrics& m, int64_t tokens, int64_t steps_left, const StepCost& cost) {
  const double dt = cost.seconds;
  ema_step_ = ema_step_ < 0 ? dt : 0.9 * ema_step_ + 0.1 * dt;
  m.step_seconds = dt;
  m.time = cost.ended;
  m.data_seconds = cost.data_seconds;
  m.comm_seconds = cost.comm_seconds;
  m.checkpoint_seconds = cost.checkpoint_seconds;
  m.tokens_per_second = static_cast<double>(tokens) / dt;
  m.eta_seconds = ema_step_ * static_cast<double>(steps_left);
  // Every rank measured the peak of its own share of the machine.
  m.mfu = m.tokens_per_second * flops_per_token_ / (peak_ * world_);
  if (m.mfu > 1.0 && reprobes_left_ > 0) {
    // The model ran faster than the probe did: the machine was busy when it probed.
    --reprobes_left_;
    peak_ = std::max(peak_, probe_matmul_peak());
    log_.info("matmul peak re-measured: {:.1f} GFLOP/s", peak_ / 1e9);
    m.mfu = m.tokens_per_second * flops_per_token_ / (peak_ * world_);
  }
  const auto mem = read_memory();
  m.rss_mb = mem.rss_mb;
  m.peak_rss_mb = mem.peak_rss_mb;
  m.peak_gpu_mb = std::max(device_peak_before_probe_mb_, peak_device_mb(device_));
  m.peak_host_tensor_mb = std::max(host_peak_before_probe_mb_, mib(peak_host_tensor_bytes()));
  m.host_tensor_mb = mib(host_tensor_bytes());
  const DataParallel* dp = pm_.data_parallel.get();
  m.param_bytes = (dp ? dp->param_bytes() : flat_bytes_) + frozen_bytes_;
  m.grad_bytes = dp ? dp->grad_bytes() : flat_bytes_;
  m.optimizer_bytes = pm_.optim->state_bytes() + (pm_.expert_optim ? pm_.expert_optim->state_bytes() : 0);
  if (dp) {
    m.transient_bytes = dp->peak_transient_bytes();
    m.comm_bytes = cost.comm_bytes;
  }
}

}  // namespace tide
