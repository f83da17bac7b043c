// What the emulated kernels' tests share: inputs in each element type, references in
// double, and bounds on the difference that follow from the arithmetic.
//
// The bounds: u = 2^-24, fp32's unit roundoff; a sum of n terms in any order is within
// n u sum|terms| of its exact value, each product or quotient adds u of its magnitude. A
// result stored in bf16 (fp16) is then rounded once more: half a step, 2^-8 (2^-11) of its
// magnitude.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_emulation.h"
#include "fused_kernels.h"

namespace tide::kernels {

constexpr double kUnitFp32 = 1.0 / (1 << 24);

inline float to_host_float(float v) { return v; }
inline float to_host_float(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float to_host_float(__half v) { return __half2float(v); }

template <typename T>
T from_host_float(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(v);
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half(v);
  else
    return v;
}

template <typename T>
constexpr Element element_of() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return Element::BF16;
  else if constexpr (std::is_same_v<T, __half>)
    return Element::F16;
  else
    return Element::F32;
}

template <typename T>
const char* element_name() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return "bf16";
  else if constexpr (std::is_same_v<T, __half>)
    return "fp16";
  else
    return "fp32";
}

// The error of storing an fp32 result near `exact` as T (none for fp32 itself): half a
// step, relative to the value among normal numbers (2^-8 for bf16, 2^-11 for fp16),
// absolute among the subnormals (fp16's begin at 2^-14).
template <typename T>
double storage_error(double exact) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return std::abs(exact) / 256 + std::ldexp(1.0, -134);
  else if constexpr (std::is_same_v<T, __half>)
    return std::abs(exact) / 2048 + std::ldexp(1.0, -25);
  else
    return 0.0;
}

// n values ~ N(0, scale^2), already rounded to T.
template <typename T>
std::vector<T> random_values(std::size_t n, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(scale));
  std::vector<T> v(n);
  for (auto& x : v) x = from_host_float<T>(normal(gen));
  return v;
}

template <typename T>
std::vector<double> as_double(const T* p, std::size_t n) {
  std::vector<double> d(n);
  for (std::size_t i = 0; i < n; ++i) d[i] = to_host_float(p[i]);
  return d;
}
template <typename T>
std::vector<double> as_double(const std::vector<T>& v) {
  return as_double(v.data(), v.size());
}

// Checks |got[i] - want[i]| <= bound[i] for every i, reporting the worst excess and where.
inline void expect_within(const std::vector<double>& got, const std::vector<double>& want,
                          const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(got.size(), bound.size()) << what;
  double worst = -1;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double excess = std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]) - bound[i];
    if (excess > worst || i == 0) {
      worst = excess;
      at = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " is " << got[at] << ", the reference " << want[at]
                        << ", bound " << bound[at];
}

}  // namespace tide::kernels
