#include "model/normal_draw.h"

#include <array>
#include <cmath>

#include <ATen/Parallel.h>
#include <ATen/core/PhiloxRNGEngine.h>

namespace tide {
namespace {

constexpr float kTwoPi = 6.28318530717958647692f;

// The four values of counter block `block`.
std::array<float, 4> normal_block(uint64_t key, float std, uint64_t block) {
  at::philox_engine engine(key, /*subsequence=*/0, /*offset=*/block);
  uint32_t w[4];
  for (auto& x : w) x = engine();
  // A word's top 24 bits, (k + 1/2) / 2^24: exact in float, inside (0, 1), so the
  // logarithm is finite (the largest value is sqrt(2 ln 2^25) = 5.9 std).
  auto uniform = [](uint32_t x) { return (static_cast<float>(x >> 8) + 0.5f) * 0x1p-24f; };
  std::array<float, 4> out;
  for (size_t k = 0; k < 4; k += 2) {
    const float r = std::sqrt(-2.0f * std::log(uniform(w[k]))) * std;
    float s, c;
    ::sincosf(kTwoPi * uniform(w[k + 1]), &s, &c);
    out[k] = r * c;
    out[k + 1] = r * s;
  }
  return out;
}

}  // namespace

void draw_normal(uint64_t key, double std, int64_t first, float* out, int64_t n) {
  // Grains of whole blocks, so that a thread's range starts a block where it can.
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    while (i < end) {
      const uint64_t index = static_cast<uint64_t>(first + i);
      const auto values = normal_block(key, static_cast<float>(std), index / 4);
      for (uint64_t k = index % 4; k < 4 && i < end; ++k, ++i) out[i] = values[k];
    }
  });
}

}  // namespace tide
