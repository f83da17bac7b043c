// The emulated GPU itself (cuda_emulation.h): barriers and shuffles behave as a GPU's,
// and what a GPU leaves undefined fails the launch, saying what; bf16 and fp16 round as
// CUDA's conversions do.
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_emulation.h"

namespace tide::cuda_emulation {
namespace {

__global__ void lane_sums(int* out) {
  int v = static_cast<int>(threadIdx.x % 32);
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void neighbours(int* out) {
  __shared__ int seen[256];
  seen[threadIdx.x] = static_cast<int>(blockIdx.x * 1000 + threadIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = seen[(threadIdx.x + 1) % blockDim.x];
}

__global__ void half_exits_then_waits(int* out) {
  if (threadIdx.x >= 64) return;  // a barrier waits for the threads still running
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void waits_for_a_lane_at_the_block_barrier(int*) {
  if (threadIdx.x >= 32) return;
  if (threadIdx.x == 0)
    __syncthreads();
  else
    __shfl_xor_sync(0xffffffffu, 1, 1);
}

__global__ void shuffles_after_lanes_exit(int*) {
  if (threadIdx.x % 2) return;
  __shfl_xor_sync(0xffffffffu, 1, 2);
}

__global__ void diverges(int*) {
  if (threadIdx.x % 2)
    __syncthreads();
  else
    __syncthreads();
}

__global__ void reads_dynamic_shared(float* out) {
  float* mine = static_cast<float*>(dynamic_shared());
  out[threadIdx.x] = mine[threadIdx.x];
}

std::string launch_error(void (*kernel)(int*), unsigned threads) {
  std::vector<int> out(threads, 0);
  try {
    launch(kernel, 1, threads, 0, nullptr, out.data());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaEmulation, ShufflesExchangeAcrossEachWarp) {
  std::vector<int> out(std::size_t{3} * 64, -1);
  launch(lane_sums, 3, 64, 0, nullptr, out.data());
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 496) << "thread " << i;  // 0 + ... + 31
}

TEST(CudaEmulation, ABarrierOrdersSharedMemoryInEachBlock) {
  std::vector<int> out(std::size_t{4} * 256, -1);
  launch(neighbours, 4, 256, 0, nullptr, out.data());
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 256; ++t) ASSERT_EQ(out[b * 256 + t], b * 1000 + (t + 1) % 256) << b << ", " << t;
}

TEST(CudaEmulation, ABarrierWaitsOnlyForThreadsThatHaveNotExited) {
  std::vector<int> out(256, 0);
  launch(half_exits_then_waits, 1, 256, 0, nullptr, out.data());
  for (int t = 0; t < 256; ++t) ASSERT_EQ(out[t], t < 64 ? 1 : 0) << t;
}

TEST(CudaEmulation, UndefinedBarriersFailTheLaunch) {
  const auto deadlock = launch_error(waits_for_a_lane_at_the_block_barrier, 256);
  EXPECT_NE(deadlock.find("deadlock"), std::string::npos) << deadlock;
  const auto divergent = launch_error(diverges, 64);
  EXPECT_NE(divergent.find("divergent __syncthreads"), std::string::npos) << divergent;
  const auto exited = launch_error(shuffles_after_lanes_exit, 64);
  EXPECT_NE(exited.find("a shuffle over the whole warp"), std::string::npos)
      << exited;  // however many have exited by then
  // The same barrier also passes when every thread stands at it.
  EXPECT_EQ(launch_error(neighbours, 256), "");
}

TEST(CudaEmulation, LaunchLimitsAreAGpus) {
  EXPECT_NE(launch_error(neighbours, 2048).find("2048 x 1 x 1 threads"), std::string::npos);
  std::vector<float> out(32);
  const auto over_default = [&] { launch(reads_dynamic_shared, 1, 32, std::size_t{64} * 1024, nullptr, out.data()); };
  EXPECT_THROW(over_default(), std::runtime_error);
  cudaFuncSetAttribute(reads_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
  over_default();
  // Shared memory starts holding anything: NaNs here, so that a read before a write shows.
  for (float v : out) ASSERT_TRUE(std::isnan(v));
}

TEST(CudaEmulation, HalfPrecisionConversionsRoundToNearestEven) {
  const auto bf16 = [](float f) { return __bfloat162float(__float2bfloat16(f)); };
  EXPECT_EQ(bf16(1.0f + 0x1p-8f), 1.0f);                      // a tie, to the even 1
  EXPECT_EQ(bf16(1.0f + 0x1p-7f + 0x1p-8f), 1.0f + 0x1p-6f);  // a tie, to the even neighbour above
  EXPECT_EQ(bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(bf16(NAN)));
  EXPECT_EQ(bf16(-INFINITY), -INFINITY);
  const auto f16 = [](float f) { return __half2float(__float2half(f)); };
  EXPECT_EQ(f16(1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(f16(65504.0f), 65504.0f);
  EXPECT_EQ(f16(65519.0f), 65504.0f);
  EXPECT_EQ(f16(65520.0f), INFINITY);
  EXPECT_EQ(f16(0x1p-24f), 0x1p-24f);          // the smallest subnormal
  EXPECT_EQ(f16(0x1p-25f), 0.0f);              // a tie, to the even 0
  EXPECT_EQ(f16(3 * 0x1p-25f), 2 * 0x1p-24f);  // a tie, to the even 2
  EXPECT_EQ(f16(-0x1p-14f), -0x1p-14f);        // the smallest normal
  EXPECT_TRUE(std::isnan(f16(NAN)));
}

}  // namespace
}  // namespace tide::cuda_emulation
