#include "cuda_emulation.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define TIDE_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TIDE_EMULATION_ASAN 1
#endif
#endif
// Under AddressSanitizer every switch between fibers is announced to it (it warns once
// that it does not fully support swapcontext; the announced switches are what it needs).
#ifdef TIDE_EMULATION_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace {
std::uint32_t bits_of(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
float float_of(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
}  // namespace

float __bfloat162float(__nv_bfloat16 v) { return float_of(static_cast<std::uint32_t>(v.bits) << 16); }

__nv_bfloat16 __float2bfloat16(float f) {
  std::uint32_t bits = bits_of(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<std::uint16_t>((bits >> 16) | 0x40u)};  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // to nearest, ties to even
  return {static_cast<std::uint16_t>(bits >> 16)};
}

float __half2float(__half v) {
  const std::uint32_t sign = static_cast<std::uint32_t>(v.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (v.bits >> 10) & 0x1fu, mantissa = v.bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return float_of(sign |
                  (exponent == 31 ? 0x7f800000u | (mantissa << 13) : ((exponent + 112) << 23) | (mantissa << 13)));
}

__half __float2half(float f) {
  const std::uint32_t bits = bits_of(f);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return {static_cast<std::uint16_t>(sign | 0x7e00u)};
  if (magnitude >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520: infinity
  if (magnitude < 0x38800000u)  // under 2^-14: a subnormal, magnitude * 2^24 rounded to an integer
    return {
        static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::lrint(float_of(magnitude) * 16777216.0f)))};
  const std::uint32_t rebased = magnitude - 0x38000000u;  // exponent 127 - 15 lower
  return {static_cast<std::uint16_t>(sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13))};
}

namespace tide::cuda_emulation {
namespace {

constexpr int kWarpSize = 32;
constexpr int kDefaultDynamicShared = 48 * 1024;
constexpr int kLargestDynamicShared = 227 * 1024;  // Hopper's opt-in limit a block
constexpr std::size_t kFiberStack = std::size_t{256} * 1024;

// Unwinds a thread of a launch that has failed.
struct Stop {};

enum class State { runnable, waiting, finished };

struct Barrier {
  int arrived = 0;
  int line = -1;
};

struct Warp {
  int lanes = 0;  // threads of the block in this warp (the last may be partial)
  int live = 0;
  Barrier barrier;
  // The lanes' values of the last two shuffles: a lane writes one while others may still
  // read the other, and cannot come back to the first before every lane has read it (it
  // waits at the next shuffle for them): one barrier a shuffle.
  std::uint64_t slots[2][kWarpSize] = {};
};

// A block's threads as fibers (ucontext) on the calling host thread, run in rounds: a
// thread runs until it waits at a barrier or exits; a barrier opens when its last live
// member arrives. Deterministic, and a switch costs no system call beyond the signal mask.
class Block {
 public:
  Block(int threads, dim3 grid, dim3 block, std::size_t shared_bytes, const std::function<void()>& body)
      : threads_(threads), grid_(grid), block_(block), shared_bytes_(shared_bytes), body_(body) {
    for (int first = 0; first < threads; first += kWarpSize) {
      warps_.emplace_back();
      warps_.back().lanes = std::min(kWarpSize, threads - first);
    }
    stacks_ = static_cast<char*>(mmap(nullptr, kFiberStack * static_cast<std::size_t>(threads), PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (stacks_ == MAP_FAILED) throw std::runtime_error("emulated launch: no memory for the threads' stacks");
    fibers_.resize(static_cast<std::size_t>(threads));
  }
  ~Block() { munmap(stacks_, kFiberStack * static_cast<std::size_t>(threads_)); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  // Runs block `index` (linear over the grid) to its end.
  void run(std::uint64_t index) {
    index_ = index;
    live_ = threads_;
    barrier_ = {};
    for (auto& w : warps_) {
      w.live = w.lanes;
      w.barrier = {};
    }
    shared_.assign(shared_bytes_, 0xff);  // a GPU's shared memory starts holding anything: NaNs here
    for (int t = 0; t < threads_; ++t) {
      Fiber& f = fibers_[static_cast<std::size_t>(t)];
      f.state = State::runnable;
      f.shuffles = 0;
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = stacks_ + kFiberStack * static_cast<std::size_t>(t);
      f.context.uc_stack.ss_size = kFiberStack;
      f.context.uc_link = nullptr;
      makecontext(&f.context, reinterpret_cast<void (*)()>(&Block::entry), 1, t);
    }
    // Each round takes the threads in another order (a shuffle seeded by the block, then
    // reversed every other round): a kernel whose threads race for memory that no
    // barrier orders gives results that depend on it, as it would on a GPU.
    std::vector<int> order(static_cast<std::size_t>(threads_));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<std::uint32_t>(index_)));
    int finished = 0;
    while (finished < threads_) {
      bool ran = false;
      std::reverse(order.begin(), order.end());
      for (const int t : order) {
        Fiber& f = fibers_[static_cast<std::size_t>(t)];
        if (f.state != State::runnable) continue;
        ran = true;
        resume(t);
        if (f.state == State::finished) ++finished;
      }
      if (!ran) {
        // Every live thread waits at a barrier that only another could open.
        if (error_.empty())
          error_ = "deadlock: every live thread of block " + std::to_string(index_) + " (" + std::to_string(live_) +
                   ") waits at a barrier that waits for threads that have exited or wait elsewhere";
        wake_all();
      }
    }
  }

  const std::string& error() const { return error_; }
  void* shared() { return shared_.data(); }

  void sync_block(int line) { arrive(barrier_, live_, line, "__syncthreads"); }

  std::uint64_t shuffle_xor(std::uint64_t bits, int lane_mask, int line) {
    const int lane = current_ % kWarpSize, warp = current_ / kWarpSize;
    Warp& w = warps_[static_cast<std::size_t>(warp)];
    if (w.live != kWarpSize)
      fail("a shuffle over the whole warp at line " + std::to_string(line) + " with " + std::to_string(w.live) +
           " lanes live");
    if (lane_mask < 0 || lane_mask >= kWarpSize) fail("a shuffle's lane mask " + std::to_string(lane_mask));
    auto& slots = w.slots[fibers_[static_cast<std::size_t>(current_)].shuffles++ % 2];
    slots[lane] = bits;
    arrive(w.barrier, w.live, line, "shuffle");
    return slots[lane ^ lane_mask];
  }

  const Place& place() const { return place_; }
  // The block whose thread is running on this host thread, if any.
  static Block* current() { return running_; }

 private:
  struct Fiber {
    ucontext_t context;
    State state = State::runnable;
    const Barrier* waiting_at = nullptr;
    std::uint64_t shuffles = 0;  // this lane's shuffles so far: which slots it writes
  };

  static thread_local Block* running_;

  static void entry(int t) {
    Block& b = *running_;
    b.finish_switch();
    try {
      b.body_();
    } catch (const Stop&) {
    } catch (const std::exception& e) {
      if (b.error_.empty()) b.error_ = std::string("a thread threw: ") + e.what();
      b.wake_all();
    }
    b.exit_thread(t);
    b.yield();  // never resumed
  }

  void exit_thread(int t) {
    Warp& w = warps_[static_cast<std::size_t>(t / kWarpSize)];
    --live_;
    --w.live;
    fibers_[static_cast<std::size_t>(t)].state = State::finished;
    if (error_.empty() && w.barrier.arrived > 0)
      error_ = "a lane of warp " + std::to_string(t / kWarpSize) + " exited while others wait at its shuffle (line " +
               std::to_string(w.barrier.line) + ")";
    // A barrier that waited only for this thread opens.
    if (barrier_.arrived > 0 && barrier_.arrived == live_) open(barrier_);
    if (!error_.empty()) wake_all();
  }

  // Arrives at `b` (of `members` live threads) from `line`; returns when it has opened.
  void arrive(Barrier& b, int members, int line, const char* what) {
    if (!error_.empty()) throw Stop{};
    if (b.arrived == 0) {
      b.line = line;
    } else if (b.line != line) {
      fail(std::string("divergent ") + what + ": threads wait at line " + std::to_string(b.line) + " and at line " +
           std::to_string(line) + " of block " + std::to_string(index_));
    }
    if (++b.arrived == members) {
      open(b);
      return;
    }
    Fiber& f = fibers_[static_cast<std::size_t>(current_)];
    f.state = State::waiting;
    f.waiting_at = &b;
    yield();
    if (!error_.empty()) throw Stop{};
  }

  void open(Barrier& b) {
    b.arrived = 0;
    for (auto& f : fibers_)
      if (f.state == State::waiting && f.waiting_at == &b) f.state = State::runnable;
  }

  [[noreturn]] void fail(const std::string& what) {
    if (error_.empty()) error_ = what;
    wake_all();
    throw Stop{};
  }

  void wake_all() {
    for (auto& f : fibers_)
      if (f.state == State::waiting) f.state = State::runnable;
  }

  void resume(int t) {
    current_ = t;
    const unsigned u = static_cast<unsigned>(t);
    place_.thread = {u % block_.x, u / block_.x % block_.y, u / (block_.x * block_.y)};
    place_.block = {static_cast<unsigned>(index_ % grid_.x), static_cast<unsigned>(index_ / grid_.x % grid_.y),
                    static_cast<unsigned>(index_ / (static_cast<std::uint64_t>(grid_.x) * grid_.y))};
    place_.block_dim = {block_.x, block_.y, block_.z};
    place_.grid_dim = {grid_.x, grid_.y, grid_.z};
    Block* outer = running_;
    running_ = this;
#ifdef TIDE_EMULATION_ASAN
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, stacks_ + kFiberStack * static_cast<std::size_t>(t), kFiberStack);
#endif
    swapcontext(&scheduler_, &fibers_[static_cast<std::size_t>(t)].context);
#ifdef TIDE_EMULATION_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    running_ = outer;
  }

  // From a fiber back to the scheduler.
  void yield() {
#ifdef TIDE_EMULATION_ASAN
    void* fake_stack = nullptr;
    const bool finished = fibers_[static_cast<std::size_t>(current_)].state == State::finished;
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake_stack, scheduler_stack_bottom_, scheduler_stack_size_);
#endif
    swapcontext(&fibers_[static_cast<std::size_t>(current_)].context, &scheduler_);
#ifdef TIDE_EMULATION_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  }

  // A fiber's first instructions: completes the switch that started it.
  void finish_switch() {
#ifdef TIDE_EMULATION_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom_, &scheduler_stack_size_);
#endif
  }

  const int threads_;
  const dim3 grid_, block_;
  const std::size_t shared_bytes_;
  const std::function<void()>& body_;
  std::vector<Warp> warps_;
  std::vector<Fiber> fibers_;
  char* stacks_ = nullptr;
  ucontext_t scheduler_;
  const void* scheduler_stack_bottom_ = nullptr;
  std::size_t scheduler_stack_size_ = 0;
  std::uint64_t index_ = 0;
  int live_ = 0;
  int current_ = 0;
  Barrier barrier_;
  std::string error_;
  std::vector<unsigned char> shared_;
  Place place_{};
};

thread_local Block* Block::running_ = nullptr;

std::mutex limits_mutex;
std::map<const void*, int>& dynamic_shared_limits() {
  static std::map<const void*, int> limits;
  return limits;
}

void check_configuration(const void* kernel, dim3 grid, dim3 block, std::size_t shared_bytes) {
  const auto threads = static_cast<std::uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64)
    throw std::runtime_error("launch: a block of " + std::to_string(block.x) + " x " + std::to_string(block.y) + " x " +
                             std::to_string(block.z) + " threads (at most 1024, z at most 64)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    throw std::runtime_error("launch: a grid of " + std::to_string(grid.x) + " x " + std::to_string(grid.y) + " x " +
                             std::to_string(grid.z) + " blocks");
  int limit = kDefaultDynamicShared;
  {
    std::lock_guard<std::mutex> lock(limits_mutex);
    const auto it = dynamic_shared_limits().find(kernel);
    if (it != dynamic_shared_limits().end()) limit = it->second;
  }
  if (shared_bytes > static_cast<std::size_t>(limit))
    throw std::runtime_error("launch: " + std::to_string(shared_bytes) + " bytes of dynamic shared memory, over " +
                             std::to_string(limit) + " (cudaFuncSetAttribute raises the limit)");
}

Block& running_block() {
  Block* b = Block::current();
  if (!b) throw std::logic_error("a kernel's call outside an emulated launch");
  return *b;
}

}  // namespace

namespace {
std::atomic<bool> take_cpu_tensors{false};  // autograd may run a backward on another thread
}  // namespace

bool kernels_take_cpu_tensors() { return take_cpu_tensors; }
EmulatedKernelsScope::EmulatedKernelsScope() : before_(take_cpu_tensors) { take_cpu_tensors = true; }
EmulatedKernelsScope::~EmulatedKernelsScope() { take_cpu_tensors = before_; }

const Place& place() { return running_block().place(); }
void sync_block(int line) { running_block().sync_block(line); }
std::uint64_t shuffle_xor(std::uint64_t bits, int lane_mask, int line) {
  return running_block().shuffle_xor(bits, lane_mask, line);
}
void* dynamic_shared() { return running_block().shared(); }

void set_max_dynamic_shared(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > kLargestDynamicShared)
    throw std::runtime_error("cudaFuncSetAttribute: " + std::to_string(bytes) + " bytes of dynamic shared memory");
  std::lock_guard<std::mutex> lock(limits_mutex);
  dynamic_shared_limits()[kernel] = bytes;
}

void run_grid(const void* kernel, dim3 grid, dim3 block, std::size_t shared_bytes,
              const std::function<void()>& thread) {
  check_configuration(kernel, grid, block, shared_bytes);
  Block b(static_cast<int>(block.x * block.y * block.z), grid, block, shared_bytes, thread);
  const std::uint64_t blocks = static_cast<std::uint64_t>(grid.x) * grid.y * grid.z;
  for (std::uint64_t k = 0; k < blocks && b.error().empty(); ++k) b.run(k);
  if (!b.error().empty()) throw std::runtime_error("emulated launch failed: " + b.error());
}

}  // namespace tide::cuda_emulation
