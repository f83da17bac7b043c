// The gated MLP kernels (engine/src/kernels/glu.cu: SwiGLU's silu and GeGLU's tanh-form
// gelu) on the emulated GPU against the exact arithmetic in double: 16-byte packs and
// element at a time, the gate's gradient written over the output's, the product remade in
// the backward pass.
#include "kernel_test_support.h"

namespace tide::kernels {
namespace {

// A few fp32 operations an element: sigmoid as 1 / (1 + exp(-g)) or tanh (expf, tanhf
// within an ulp here), then a handful of sums and products. 32 u of the terms' magnitudes
// bounds them; (1 - s) and (1 - t^2) cancel where s or |t| nears 1, so their absolute
// error counts against the size of what multiplies them.
constexpr double kElementwise = 32 * kUnitFp32;

// The activation in double, its value and slope, and bounds on the magnitude of the terms
// each is made of (what their rounding errors scale with).
struct Exact {
  double value, slope, value_terms, slope_terms;
};

Exact exact(Gate act, double g) {
  if (act == Gate::Silu) {
    const double s = 1.0 / (1.0 + std::exp(-g));
    return {g * s, s * (1.0 + g * (1.0 - s)), std::abs(g) * s, s * (1.0 + std::abs(g))};
  }
  // gelu's tanh form: 1 + t cancels as g goes negative. t's error is an ulp of t, plus
  // the error of its argument (relative, some ulps) times tanh's slope 1 - t^2.
  const double b = std::sqrt(2.0 / M_PI), k = 0.044715;
  const double arg = b * (g + k * g * g * g), t = std::tanh(arg), dt = 1.0 - t * t;
  const double t_error = 1.0 + dt * std::abs(arg);  // in ulps of 1
  const double outer = 0.5 * std::abs(g) * b * (1.0 + 3.0 * k * g * g);
  return {0.5 * g * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * g * dt * b * (1.0 + 3.0 * k * g * g),
          0.5 * std::abs(g) * (1.0 + std::abs(t) + t_error),
          0.5 * (1.0 + std::abs(t) + t_error) + outer * (1.0 + 2.0 * t_error)};
}

struct Case {
  Gate act;
  int64_t n;
  int offset;  // elements past an aligned address
  bool in_place, product;
};

template <typename T>
void check_glu(const Case& c) {
  SCOPED_TRACE(std::string(c.act == Gate::Silu ? "silu " : "gelu_tanh ") + element_name<T>() +
               " n=" + std::to_string(c.n) + (c.offset ? " unaligned" : "") + (c.in_place ? " in place" : "") +
               (c.product ? " +product" : ""));
  const auto n = static_cast<std::size_t>(c.n);
  auto gate_buf = random_values<T>(n + c.offset, 5, 3.0), up_buf = random_values<T>(n + c.offset, 6);
  auto d_buf = random_values<T>(n + c.offset, 7);
  std::vector<T> out_buf(n + c.offset), dgate_buf(n + c.offset), dup_buf(n + c.offset), product_buf(n + c.offset);
  const T* gate = gate_buf.data() + c.offset;
  const T* up = up_buf.data() + c.offset;
  T* d_out = d_buf.data() + c.offset;
  const auto gd = as_double(gate, n), ud = as_double(up, n), dd = as_double(d_out, n);

  glu_forward(c.act, gate, up, out_buf.data() + c.offset, c.n, element_of<T>(), nullptr);
  T* d_gate = c.in_place ? d_out : dgate_buf.data() + c.offset;
  T* product = c.product ? product_buf.data() + c.offset : nullptr;
  glu_backward(c.act, d_out, gate, up, d_gate, dup_buf.data() + c.offset, product, c.n, element_of<T>(), nullptr);

  std::vector<double> out_want(n), out_bound(n), dg_want(n), dg_bound(n), du_want(n), du_bound(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double g = gd[i], u = ud[i], d = dd[i];
    const auto a = exact(c.act, g);
    out_want[i] = a.value * u;
    out_bound[i] = kElementwise * std::abs(u) * a.value_terms + storage_error<T>(out_want[i]);
    dg_want[i] = d * u * a.slope;
    dg_bound[i] = kElementwise * std::abs(d * u) * a.slope_terms + storage_error<T>(dg_want[i]);
    du_want[i] = d * a.value;
    du_bound[i] = kElementwise * std::abs(d) * a.value_terms + storage_error<T>(du_want[i]);
  }
  expect_within(as_double(out_buf.data() + c.offset, n), out_want, out_bound, "out");
  expect_within(as_double(d_gate, n), dg_want, dg_bound, "d_gate");
  expect_within(as_double(dup_buf.data() + c.offset, n), du_want, du_bound, "d_up");
  if (c.product) {
    // The same function of the same inputs as the forward pass: the same bits.
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(to_host_float(product[i]), to_host_float(out_buf[c.offset + i])) << "product, element " << i;
  }
}

TEST(EmulatedKernels, GluPacksAndElementsForwardAndBackward) {
  for (const Gate act : {Gate::Silu, Gate::GeluTanh}) {
    check_glu<__nv_bfloat16>({act, int64_t{8} * 300, 0, false, true});  // whole packs of 8
    check_glu<__nv_bfloat16>({act, int64_t{8} * 300, 0, true, false});  // d_gate over d_out
    check_glu<__nv_bfloat16>({act, 2403, 0, false, true});              // not whole packs
    check_glu<float>({act, int64_t{4} * 512, 1, true, true});           // unaligned: element at a time
    check_glu<float>({act, int64_t{4} * 1004, 0, false, false});        // the last block partly past the end
    check_glu<__half>({act, 1000, 0, false, true});
  }
}

}  // namespace
}  // namespace tide::kernels
