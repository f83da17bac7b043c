// The CUDA that tide's kernels (engine/src/kernels) use, on the CPU: the kernels' own
// source, compiled as C++ with TIDE_CUDA_EMULATION, runs here so that CPU CI tests it
// (as Triton's interpreter and Numba's CUDA simulator do for theirs).
//
// A launch runs its blocks one after another, a block's threads as fibers on the calling
// thread, so that barriers and warp shuffles behave as on a GPU: __syncthreads waits for
// the block's live threads, a shuffle for its warp's. What a GPU leaves undefined fails the
// launch with a message: a barrier that can never open (deadlock), threads of a block (or
// lanes of a warp) at different barriers (divergence), a shuffle reading a lane that has
// exited, a block of more than 1024 threads, dynamic shared memory over 48 KiB without
// cudaFuncSetAttribute. Memory is the host's: tests allocate exact buffers and build under
// AddressSanitizer and UBSan (out-of-bounds and misaligned 16-byte accesses).
//
// Not emulated: the GPU's rounding of its fast intrinsics (__expf here is expf), fused
// multiply-adds (kernels compile with -ffp-contract=off), races between blocks (one at a
// time). Races between a block's threads show only as far as the order the fibers run in
// (each until it waits; shuffled, and reversed every round) changes a result.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <utility>

// Kernel qualifiers: plain functions on the host.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// A block's static shared memory: blocks run one at a time, so one copy serves them all.
#define __shared__ static

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

namespace tide::cuda_emulation {
// Each host thread's place in its launch, read through a call: GCC's null check of a
// thread_local read from another file tests flags the linker's TLS relaxation does not set
// (a false "null pointer" from UBSan).
struct Place {
  uint3 thread, block, block_dim, grid_dim;
};
const Place& place();
}  // namespace tide::cuda_emulation
#define threadIdx (::tide::cuda_emulation::place().thread)
#define blockIdx (::tide::cuda_emulation::place().block)
#define blockDim (::tide::cuda_emulation::place().block_dim)
#define gridDim (::tide::cuda_emulation::place().grid_dim)

// The runtime's calls the kernels' hosts make. A launch's failure is thrown from the
// launch itself (its message says what), so the error a later call reads is always none.
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }

// bf16 and fp16 as bits, converted as the CUDA headers do: to nearest even, NaN kept.
struct __nv_bfloat16 {
  std::uint16_t bits;
};
struct __half {
  std::uint16_t bits;
};
float __bfloat162float(__nv_bfloat16 v);
__nv_bfloat16 __float2bfloat16(float f);
float __half2float(__half v);
__half __float2half(float f);

// Intrinsics. The _rn forms are single IEEE operations (the host's, without contraction).
inline float __expf(float v) { return std::exp(v); }
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
// A store with the default (write-back) cache policy: a plain store here.
inline void __stwb(uint4* p, uint4 v) { *p = v; }

namespace tide::cuda_emulation {

// The calling thread's block: waits for its live threads to reach this barrier (line:
// where it stands in the source, for the divergence check).
void sync_block(int line);
// Exchanges `bits` across the calling thread's warp: every lane of the warp passes its
// own and gets lane (its lane ^ lane_mask)'s.
std::uint64_t shuffle_xor(std::uint64_t bits, int lane_mask, int line);
// The block's dynamic shared memory (the launch's size; filled with NaN bytes at each
// block's start, as a GPU leaves it holding anything).
void* dynamic_shared();
// Sets the largest dynamic shared memory `kernel` may launch with (default 48 KiB).
void set_max_dynamic_shared(const void* kernel, int bytes);
// Whether tide's fused ops hand the CPU's tensors to the emulated kernels (the glue of
// engine/src/model, built for the emulation: cuda_kernel_args.h); off unless a scope is open.
bool kernels_take_cpu_tensors();
class EmulatedKernelsScope {
 public:
  EmulatedKernelsScope();
  ~EmulatedKernelsScope();
  EmulatedKernelsScope(const EmulatedKernelsScope&) = delete;
  EmulatedKernelsScope& operator=(const EmulatedKernelsScope&) = delete;

 private:
  bool before_;
};
// Runs `thread` for every thread of every block of the grid.
void run_grid(const void* kernel, dim3 grid, dim3 block, std::size_t shared_bytes, const std::function<void()>& thread);

}  // namespace tide::cuda_emulation

#define __syncthreads() ::tide::cuda_emulation::sync_block(__LINE__)

namespace tide::cuda_emulation {
template <typename T>
T shuffle_xor_at(int line, T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t), "__shfl_xor_sync: at most 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = shuffle_xor(bits, lane_mask, line);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
}  // namespace tide::cuda_emulation

// The mask is the whole warp wherever tide's kernels shuffle; every lane must take part.
#define __shfl_xor_sync(mask, v, lane_mask) ::tide::cuda_emulation::shuffle_xor_at(__LINE__, v, lane_mask)

template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attribute, int value) {
  if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize)
    ::tide::cuda_emulation::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), value);
  return cudaSuccess;
}

namespace tide::cuda_emulation {

// kernel<<<grid, block, shared, stream>>>(args...): each thread calls the kernel with its
// own copies of the arguments, converted as a launch converts them.
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t, A&&... args) {
  const std::tuple<P...> params(static_cast<P>(args)...);
  run_grid(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, [&] { std::apply(kernel, params); });
}

}  // namespace tide::cuda_emulation
