#include "tide/engine/train/tensor_memory.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include <c10/core/CPUAllocator.h>

namespace tide {

namespace {
std::atomic<int64_t> live{0}, peak{0};

void add(int64_t bytes) {
  const int64_t now = live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// Every block carries its size in a header in front of the data. The DataPtr's context
// must be its data pointer: LibTorch's raw_allocate asserts it (oneDNN's bf16 kernels
// take scratch memory that way) and frees through raw_deleter() with that pointer alone.
// The header is as long as the allocator's alignment, so the data stays aligned.
constexpr size_t kHeader = c10::gAlignment;
static_assert(kHeader >= sizeof(int64_t), "the header holds the block's size");

c10::Allocator* inner = nullptr;  // LibTorch's CPU allocator, set once before counting starts

void release(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  live.fetch_sub(bytes, std::memory_order_relaxed);
  inner->raw_deallocate(base);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* base = inner->raw_allocate(n + kHeader);
    const auto bytes = static_cast<int64_t>(n);
    std::memcpy(base, &bytes, sizeof bytes);
    add(bytes);
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};
}  // namespace

void count_host_tensor_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    inner = c10::GetCPUAllocator();
    static CountingAllocator counting;
    c10::SetCPUAllocator(&counting, /*priority=*/1);
  });
}

int64_t host_tensor_bytes() { return live.load(std::memory_order_relaxed); }
int64_t peak_host_tensor_bytes() { return peak.load(std::memory_order_relaxed); }
void reset_peak_host_tensor_bytes() { peak.store(live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace tide
