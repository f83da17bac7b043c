// The RMSNorm kernels (engine/src/kernels/rms_norm.cu) on the emulated GPU against the
// exact arithmetic in double: the warp-a-row path (16-byte packs), the block-a-row path
// (wide rows, unaligned rows), more rows than the backward's partial sums, the residual
// gradient joined in the norm's pass, and a weight gradient wide enough to need the
// larger shared memory the launch asks for.
#include <algorithm>

#include "kernel_test_support.h"

namespace tide::kernels {
namespace {

struct Case {
  int64_t rows, cols;
  bool with_add;
  int offset;        // elements the activations start past an aligned address (1: no 16-byte packs)
  int w_offset = 0;  // the same for the weight (1: the warp path's 16-byte weight loads cannot be)
};

std::string describe(const Case& c, const char* element) {
  return std::string(element) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
         (c.with_add ? " +add" : "") + (c.offset ? " unaligned" : "") + (c.w_offset ? " unaligned weight" : "");
}

template <typename T>
void check_rms_norm(const Case& c) {
  SCOPED_TRACE(describe(c, element_name<T>()));
  const auto n = static_cast<std::size_t>(c.rows * c.cols);
  const float eps = 1e-5f;
  // Buffers of exactly their size (AddressSanitizer sees a step outside), activations
  // `offset` elements into theirs.
  auto x_buf = random_values<T>(n + c.offset, 1, 2.0), dy_buf = random_values<T>(n + c.offset, 2);
  auto add_buf = random_values<T>(n + c.offset, 3);
  std::vector<T> y_buf(n + c.offset), dx_buf(n + c.offset);
  const T* x = x_buf.data() + c.offset;
  const T* dy = dy_buf.data() + c.offset;
  const T* add = c.with_add ? add_buf.data() + c.offset : nullptr;
  T* y = y_buf.data() + c.offset;
  T* dx = dx_buf.data() + c.offset;
  const auto w_values = random_values<float>(static_cast<std::size_t>(c.cols), 4);
  std::vector<float> w_buf(static_cast<std::size_t>(c.w_offset)), rstd(static_cast<std::size_t>(c.rows));
  w_buf.insert(w_buf.end(), w_values.begin(), w_values.end());
  const float* w = w_buf.data() + c.w_offset;
  const int64_t partials = rms_norm_partials(c.rows);
  std::vector<float> dw_partial(static_cast<std::size_t>(partials * c.cols));

  rms_norm_forward(x, w, y, rstd.data(), c.rows, c.cols, eps, element_of<T>(), nullptr);
  rms_norm_backward(dy, x, w, rstd.data(), add, dx, dw_partial.data(), c.rows, c.cols, element_of<T>(), nullptr);

  const auto xd = as_double(x, n), gd = as_double(dy, n), wd = as_double(w, static_cast<std::size_t>(c.cols));
  const auto ad = add ? as_double(add, n) : std::vector<double>(n, 0.0);
  std::vector<double> y_want(n), y_bound(n), r_want(c.rows), r_bound(c.rows), dx_want(n), dx_bound(n);
  std::vector<double> dw_want(c.cols, 0.0), dw_scale(c.cols, 0.0);
  const double u = kUnitFp32, cols = static_cast<double>(c.cols);
  // r's relative error: the sum of cols squares (cols u), the mean, eps and the reciprocal
  // square root (four roundings, two ulp on a GPU's rsqrtf).
  const double r_rel = (cols + 8) * u;
  for (int64_t row = 0; row < c.rows; ++row) {
    double squares = 0, dot = 0, dot_scale = 0;
    for (int64_t k = 0; k < c.cols; ++k) squares += xd[row * c.cols + k] * xd[row * c.cols + k];
    const double r = 1.0 / std::sqrt(squares / cols + eps);
    r_want[row] = r;
    r_bound[row] = r_rel * r;
    for (int64_t k = 0; k < c.cols; ++k) {
      const std::size_t i = row * c.cols + k;
      const double xn = xd[i] * r;
      dot += gd[i] * wd[k] * xn;
      dot_scale += std::abs(gd[i] * wd[k] * xn);
      dw_want[k] += gd[i] * xn;
      dw_scale[k] += std::abs(gd[i] * xn);
    }
    const double mean_dot = dot / cols, mean_scale = dot_scale / cols;
    for (int64_t k = 0; k < c.cols; ++k) {
      const std::size_t i = row * c.cols + k;
      const double xn = xd[i] * r;
      y_want[i] = xn * wd[k];
      // r's error, then x r w: two roundings.
      y_bound[i] = (r_rel + 2 * u) * std::abs(y_want[i]) + storage_error<T>(y_want[i]);
      dx_want[i] = r * (gd[i] * wd[k] - xn * mean_dot) + ad[i];
      // dx = r g w - r^3 x sum(g w x) / cols: r's error counts up to three times, the dot's
      // sum cols + 3 roundings, the rest a few; the add one rounding more.
      const double scale = std::abs(r * gd[i] * wd[k]) + std::abs(xn) * r * mean_scale + std::abs(ad[i]);
      dx_bound[i] = (3 * r_rel + (cols + 12) * u) * scale + storage_error<T>(dx_want[i]);
    }
  }
  // The weight's gradient: each partial sums rows_per_block rows a lane at a time, then
  // the block's eight warps' sums; xn carries r's error.
  const int64_t rows_per_partial = (c.rows + partials - 1) / partials;  // rounded up
  const auto rows_per_block = static_cast<double>(rows_per_partial);
  std::vector<double> dw_got(c.cols, 0.0), dw_bound(c.cols);
  for (int64_t p = 0; p < partials; ++p)
    for (int64_t k = 0; k < c.cols; ++k) dw_got[k] += dw_partial[p * c.cols + k];
  for (int64_t k = 0; k < c.cols; ++k) dw_bound[k] = (r_rel + (rows_per_block + 12) * u) * dw_scale[k];

  expect_within(as_double(y, n), y_want, y_bound, "y");
  expect_within(as_double(rstd), r_want, r_bound, "rstd");
  expect_within(as_double(dx, n), dx_want, dx_bound, "dx");
  expect_within(dw_got, dw_want, dw_bound, "dw");
  // Nothing written before the activations' start.
  if (c.offset) {
    EXPECT_EQ(to_host_float(y_buf[0]), 0.0f);
  }
}

TEST(EmulatedKernels, RmsNormWarpPathAtMoreRowsThanPartialSums) {
  check_rms_norm<float>({1100, 1000, false, 0});  // 1024 partials of two rows, the last 474 of none
}

TEST(EmulatedKernels, RmsNormWarpPathJoinsTheResidualGradient) {
  // The packs a lane holds: 4 (1000 bf16), 8 (2048: the widest row a warp takes), 2, 1.
  check_rms_norm<__nv_bfloat16>({37, 1000, true, 0});
  check_rms_norm<__nv_bfloat16>({20, 2048, true, 0});
  check_rms_norm<__half>({9, 512, false, 0});
  check_rms_norm<__nv_bfloat16>({50, 200, true, 0});
  check_rms_norm<__nv_bfloat16>({1, 8, true, 0});  // one row of one pack: one lane of one warp works
}

TEST(EmulatedKernels, RmsNormBlockPathForWideAndUnalignedRows) {
  check_rms_norm<float>({40, 2500, true, 0});           // over 1024 fp32 a row
  check_rms_norm<__nv_bfloat16>({33, 1000, true, 1});   // rows not at 16-byte addresses
  check_rms_norm<__nv_bfloat16>({12, 1003, false, 0});  // rows not whole packs
  check_rms_norm<float>({9, 512, true, 0, 1});          // a weight not at a 16-byte address
}

TEST(EmulatedKernels, RmsNormWeightGradientOverFortyEightKibibytesOfSharedMemory) {
  check_rms_norm<float>({3, 13000, false, 0});  // 52 KB of fp32 sums: the launch raises its limit
}

}  // namespace
}  // namespace tide::kernels
