#include "tide/engine/train/runtime.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include <ATen/Parallel.h>
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <ATen/DeviceAccelerator.h>
#endif

#include "tide/engine/plan/cluster.h"

namespace tide {

int configure_threads(int64_t requested) {
  const int n = requested > 0 ? static_cast<int>(requested) : local_cores();
  at::set_num_threads(n);
  static bool interop_set = false;  // LibTorch allows setting it once per process
  if (!interop_set) {
    interop_set = true;
    try {
      at::set_num_interop_threads(1);
    } catch (...) {
    }
  }
  return n;
}

double peak_device_mb(const c10::Device& device) {
  if (device.is_cpu()) return 0;
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
  // PyTorch 2.9 on: every accelerator's caching allocator reports the same statistics.
  const auto index = device.has_index() ? device.index() : at::accelerator::getDeviceIndex();
  const auto stats = at::accelerator::getDeviceStats(index);
  const auto& allocated = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return static_cast<double>(allocated.peak) / (1024.0 * 1024.0);
#else
  return 0;  // older LibTorch: not reported
#endif
}

void reset_peak_device_memory(const c10::Device& device) {
  if (device.is_cpu()) return;
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
  at::accelerator::resetPeakStats(device.has_index() ? device.index() : at::accelerator::getDeviceIndex());
#endif
}

MemoryReading read_memory() {
  MemoryReading r;
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  r.rss_mb = static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  r.peak_rss_mb = static_cast<double>(u.ru_maxrss) / 1024.0;
  return r;
}

}  // namespace tide
