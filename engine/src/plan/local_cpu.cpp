// The local CPU as a planner device from what `tide plan --calibrate` stored (the probe
// itself needs LibTorch: train/local_device.cpp), or from nominal figures.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/engine/plan/cluster.h"

namespace tide {

DeviceSpec shared_cpu_device(DeviceSpec d, int ranks) {
  ranks = std::max(1, ranks);
  const int cores = local_cores();
  const int threads = std::max(1, cores / ranks);
  // More ranks than cores time-share them.
  const double share = std::min(1.0, static_cast<double>(cores) / ranks);
  d.memory_bytes /= ranks;
  d.fp32_flops *= share;
  d.bf16_flops *= share;
  d.attention_fp32_flops *= share;
  d.attention_bf16_flops *= share;
  d.memory_bandwidth *= share;
  // A collective between time-shared ranks waits for each to be scheduled, and its
  // copies take the same shared cores.
  d.intra_node_bandwidth *= share;
  d.inter_node_bandwidth *= share;
  d.collective_latency /= share;
  d.description = fmt::format("this machine's CPU, {} rank(s) of {} thread(s)", ranks, threads);
  return d;
}

int local_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string default_calibration_path() {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::filesystem::path base = cache && *cache ? cache : std::filesystem::path(home ? home : ".") / ".cache";
  return (base / "tide" / "calibration-cpu.json").string();
}

int threads_per_rank(int ranks) { return std::max(1, local_cores() / std::max(1, ranks)); }

namespace {
// The figures the calibration at `path` stored for a rank of `threads` threads, as
// measured (not shared among ranks); nullopt where it holds none. Throws on a corrupt
// file: the caller says which.
std::optional<DeviceSpec> stored_figures(const std::string& path, int threads) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const auto j = nlohmann::json::parse(in);
  const auto& by_threads = j.at("by_threads");
  const std::string key = std::to_string(threads);
  if (!by_threads.contains(key)) return std::nullopt;
  return device_from_json(by_threads.at(key));
}
}  // namespace

std::optional<DeviceSpec> stored_cpu_device(const std::string& path, int ranks) {
  ranks = std::max(1, ranks);
  const auto d = stored_figures(path, threads_per_rank(ranks));
  return d ? std::optional<DeviceSpec>(shared_cpu_device(*d, ranks)) : std::nullopt;
}

std::optional<double> stored_matmul_peak(const std::string& path, int threads, bool bf16) {
  const auto d = stored_figures(path, threads);
  const double peak = !d ? 0 : bf16 ? d->bf16_flops : d->fp32_flops;
  return peak > 0 ? std::optional<double>(peak) : std::nullopt;
}

DeviceSpec nominal_cpu_device(int ranks) {
  ranks = std::max(1, ranks);
  const int threads = threads_per_rank(ranks);
  DeviceSpec d;
  d.name = "cpu";
  d.host = true;
  d.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  // A core of a current x86 server: about 60 GFLOP/s of fp32 GEMM (AVX2 FMA), elementwise
  // work at about 3 GB/s per core as a training step sees it.
  d.fp32_flops = d.bf16_flops = 60e9 * threads;
  d.matmul_efficiency = 0.8;
  d.memory_bandwidth = 3e9 * threads;
  d.bandwidth_efficiency = 1.0;
  d.intra_node_bandwidth = d.inter_node_bandwidth = d.memory_bandwidth / 4;
  d.host_link_bandwidth = d.memory_bandwidth;
  d.collective_latency = 100e-6;
  d = shared_cpu_device(d, ranks);
  d.description += " (nominal figures: tide plan --calibrate measures them)";
  return d;
}

}  // namespace tide
