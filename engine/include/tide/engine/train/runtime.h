// Process-level runtime settings and readings: threads, memory.
#pragma once

#include <cstdint>

#include <c10/core/Device.h>

namespace tide {

// Sets LibTorch's intra-op threads (0: local_cores(), plan/cluster.h) and one inter-op thread.
// LibTorch starts with a single intra-op thread on some machines, so this is explicit.
int configure_threads(int64_t requested);

struct MemoryReading {
  double rss_mb = 0;       // resident now
  double peak_rss_mb = 0;  // high-water mark of this process
};
MemoryReading read_memory();
// The most memory `device`'s caching allocator has handed to tensors since the process
// started or the last reset, in MiB (PyTorch's max_memory_allocated); 0 for the CPU.
double peak_device_mb(const c10::Device& device);
// The device's peak counts again from what tensors hold now (PyTorch's
// reset_peak_memory_stats); nothing for the CPU.
void reset_peak_device_memory(const c10::Device& device);

}  // namespace tide
