#include "tide/engine/train/tensor_memory.h"

#include <atomic>
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

// The inner allocator's pointer and deleter, and the size to give back.
struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
};

void release(void* context) {
  auto* c = static_cast<Counted*>(context);
  live.fetch_sub(c->bytes, std::memory_order_relaxed);
  delete c;  // frees the memory through the inner DataPtr
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr data = inner_->allocate(n);
    void* ptr = data.get();
    const c10::Device device = data.device();
    auto* c = new Counted{std::move(data), static_cast<int64_t>(n)};
    add(c->bytes);
    return {ptr, c, &release, device};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  c10::Allocator* inner_;
};
}  // namespace

void count_host_tensor_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/1);
  });
}

int64_t host_tensor_bytes() { return live.load(std::memory_order_relaxed); }
int64_t peak_host_tensor_bytes() { return peak.load(std::memory_order_relaxed); }
void reset_peak_host_tensor_bytes() { peak.store(live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace tide
