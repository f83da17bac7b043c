// The rotary-embedding kernel (engine/src/kernels/rope.cu) on the emulated GPU against the
// exact rotation in double, on the layouts the attention gives it: q and k as a
// [B, H, T, Hd] view of [B, T, H, Hd] memory (rows taken heads fastest), contiguous rows
// (tokens fastest), a batch of one, an output with gaps between its rows that must stay
// untouched; 16-byte packs and pairs at a time; forward and inverse.
#include <array>

#include "kernel_test_support.h"

namespace tide::kernels {
namespace {

// Strides of B, H, T for the attention's memory order [B, T, H, Hd] and for [B, H, T, Hd].
std::array<int64_t, 3> heads_fastest(int64_t heads, int64_t tokens, int64_t row) {
  return {tokens * heads * row, row, heads * row};
}
std::array<int64_t, 3> tokens_fastest(int64_t heads, int64_t tokens, int64_t row) {
  return {heads * tokens * row, tokens * row, row};
}

struct Case {
  const char* name;
  int64_t batch, heads, tokens, head_dim;
  std::array<int64_t, 3> x_stride, y_stride;
  int offset;  // x starts this many elements past an aligned address
  bool inverse;
};

int64_t span(const std::array<int64_t, 3>& stride, const Case& c) {
  return (c.batch - 1) * stride[0] + (c.heads - 1) * stride[1] + (c.tokens - 1) * stride[2] + c.head_dim;
}

template <typename T>
void check_rope(const Case& c) {
  SCOPED_TRACE(std::string(element_name<T>()) + " " + c.name + (c.inverse ? " inverse" : ""));
  const int64_t half = c.head_dim / 2;
  const auto x_buf = random_values<T>(static_cast<std::size_t>(span(c.x_stride, c) + c.offset), 8);
  const T sentinel = from_host_float<T>(12345.0f);
  std::vector<T> y_buf(static_cast<std::size_t>(span(c.y_stride, c)), sentinel);
  std::vector<T> cos(static_cast<std::size_t>(c.tokens * c.head_dim)), sin(cos.size());
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t i = 0; i < c.head_dim; ++i) {
      const double theta =
          static_cast<double>(t) * std::pow(10000.0, -2.0 * static_cast<double>(i % half) / c.head_dim);
      cos[t * c.head_dim + i] = from_host_float<T>(static_cast<float>(std::cos(theta)));
      sin[t * c.head_dim + i] = from_host_float<T>(static_cast<float>(std::sin(theta)));
    }
  RopeShape shape{c.batch, c.heads, c.tokens, c.head_dim, {}, {}};
  for (int d = 0; d < 3; ++d) {
    shape.x_stride[d] = c.x_stride[d];
    shape.y_stride[d] = c.y_stride[d];
  }
  const T* x = x_buf.data() + c.offset;
  rope(x, cos.data(), sin.data(), y_buf.data(), shape, c.inverse, element_of<T>(), nullptr);

  std::vector<bool> written(y_buf.size(), false);
  std::vector<double> got, want, bound;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t t = 0; t < c.tokens; ++t) {
        const int64_t xr = b * c.x_stride[0] + h * c.x_stride[1] + t * c.x_stride[2];
        const int64_t yr = b * c.y_stride[0] + h * c.y_stride[1] + t * c.y_stride[2];
        for (int64_t i = 0; i < half; ++i) {
          const double a = to_host_float(x[xr + i]), bb = to_host_float(x[xr + i + half]);
          const double ci = to_host_float(cos[t * c.head_dim + i]), cj = to_host_float(cos[t * c.head_dim + i + half]);
          const double si = to_host_float(sin[t * c.head_dim + i]), sj = to_host_float(sin[t * c.head_dim + i + half]);
          const double ya = c.inverse ? a * ci + bb * sj : a * ci - bb * si;
          const double yb = c.inverse ? bb * cj - a * si : bb * cj + a * sj;
          // Two products and a sum in fp32, then one rounding to T.
          const double scale_a = std::abs(a * ci) + std::abs(bb * (c.inverse ? sj : si));
          const double scale_b = std::abs(bb * cj) + std::abs(a * (c.inverse ? si : sj));
          for (const auto& [k, value, scale] : {std::tuple{i, ya, scale_a}, std::tuple{i + half, yb, scale_b}}) {
            got.push_back(to_host_float(y_buf[static_cast<std::size_t>(yr + k)]));
            want.push_back(value);
            bound.push_back(3 * kUnitFp32 * scale + storage_error<T>(value));
            written[static_cast<std::size_t>(yr + k)] = true;
          }
        }
      }
  expect_within(got, want, bound, "y");
  for (std::size_t k = 0; k < y_buf.size(); ++k) {
    if (written[k]) continue;
    ASSERT_EQ(to_host_float(y_buf[k]), to_host_float(sentinel)) << "y's gap at " << k << " written";
  }
}

TEST(EmulatedKernels, RopeOnTheAttentionsLayoutAndContiguousRows) {
  // q as the attention makes it: [B, T, H, Hd] memory, read as [B, H, T, Hd]; y contiguous.
  const Case attention{"attention layout", 2, 4, 9, 64, heads_fastest(4, 9, 64), tokens_fastest(4, 9, 64), 0, false};
  check_rope<__nv_bfloat16>(attention);
  check_rope<float>(attention);
  Case backward = attention;  // the gradient: contiguous in, the attention's layout out
  backward.name = "contiguous to the attention layout";
  backward.x_stride = tokens_fastest(4, 9, 64);
  backward.y_stride = heads_fastest(4, 9, 64);
  backward.inverse = true;
  check_rope<__nv_bfloat16>(backward);
  check_rope<float>(backward);
  check_rope<__half>(backward);
}

TEST(EmulatedKernels, RopeBatchOfOneAndRowsWithGaps) {
  check_rope<__nv_bfloat16>(
      {"batch of one", 1, 3, 17, 32, heads_fastest(3, 17, 32), heads_fastest(3, 17, 32), 0, false});
  // y rows 80 elements apart for a head of 64: the 16 between stay as they were.
  check_rope<__nv_bfloat16>({"y with gaps", 2, 2, 5, 64, tokens_fastest(2, 5, 64), tokens_fastest(2, 5, 80), 0, true});
}

TEST(EmulatedKernels, RopePairAtATimeWhereRowsAreNotWholePacks) {
  // Half a head of 6 elements: no 16-byte packs.
  check_rope<__nv_bfloat16>({"head of 12", 2, 3, 7, 12, heads_fastest(3, 7, 12), tokens_fastest(3, 7, 12), 0, false});
  // x one element past an aligned address.
  check_rope<float>({"unaligned x", 1, 2, 6, 16, tokens_fastest(2, 6, 16), tokens_fastest(2, 6, 16), 1, true});
}

}  // namespace
}  // namespace tide::kernels
