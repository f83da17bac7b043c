// The SwiGLU kernels (engine/src/kernels/swiglu.cu) on the emulated GPU against the exact
// arithmetic in double: 16-byte packs and element at a time, the gate's gradient written
// over the output's, the product remade in the backward pass.
#include "kernel_test_support.h"

namespace tide::kernels {
namespace {

// A few fp32 operations an element: sigmoid as 1 / (1 + exp(-g)) (expf within an ulp
// here), then two or three products. 32 u of the terms' magnitudes bounds them;
// (1 - s) cancels where s nears 1, so its absolute error counts against g's size.
constexpr double kElementwise = 32 * kUnitFp32;

struct Case {
  int64_t n;
  int offset;  // elements past an aligned address
  bool in_place, product;
};

template <typename T>
void check_swiglu(const Case& c) {
  SCOPED_TRACE(std::string(element_name<T>()) + " n=" + std::to_string(c.n) + (c.offset ? " unaligned" : "") +
               (c.in_place ? " in place" : "") + (c.product ? " +product" : ""));
  const auto n = static_cast<std::size_t>(c.n);
  auto gate_buf = random_values<T>(n + c.offset, 5, 3.0), up_buf = random_values<T>(n + c.offset, 6);
  auto d_buf = random_values<T>(n + c.offset, 7);
  std::vector<T> out_buf(n + c.offset), dgate_buf(n + c.offset), dup_buf(n + c.offset), product_buf(n + c.offset);
  const T* gate = gate_buf.data() + c.offset;
  const T* up = up_buf.data() + c.offset;
  T* d_out = d_buf.data() + c.offset;
  const auto gd = as_double(gate, n), ud = as_double(up, n), dd = as_double(d_out, n);

  swiglu_forward(gate, up, out_buf.data() + c.offset, c.n, element_of<T>(), nullptr);
  T* d_gate = c.in_place ? d_out : dgate_buf.data() + c.offset;
  T* product = c.product ? product_buf.data() + c.offset : nullptr;
  swiglu_backward(d_out, gate, up, d_gate, dup_buf.data() + c.offset, product, c.n, element_of<T>(), nullptr);

  std::vector<double> out_want(n), out_bound(n), dg_want(n), dg_bound(n), du_want(n), du_bound(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double g = gd[i], u = ud[i], d = dd[i], s = 1.0 / (1.0 + std::exp(-g));
    out_want[i] = g * s * u;
    out_bound[i] = kElementwise * std::abs(out_want[i]) + storage_error<T>(out_want[i]);
    dg_want[i] = d * u * s * (1.0 + g * (1.0 - s));
    dg_bound[i] = kElementwise * std::abs(d * u * s) * (1.0 + std::abs(g)) + storage_error<T>(dg_want[i]);
    du_want[i] = d * g * s;
    du_bound[i] = kElementwise * std::abs(du_want[i]) + storage_error<T>(du_want[i]);
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

TEST(EmulatedKernels, SwigluPacksAndElementsForwardAndBackward) {
  check_swiglu<__nv_bfloat16>({int64_t{8} * 300, 0, false, true});  // whole packs of 8
  check_swiglu<__nv_bfloat16>({int64_t{8} * 300, 0, true, false});  // d_gate over d_out
  check_swiglu<__nv_bfloat16>({2403, 0, false, true});              // not whole packs
  check_swiglu<float>({int64_t{4} * 512, 1, true, true});           // unaligned: element at a time
  check_swiglu<float>({int64_t{4} * 1004, 0, false, false});        // the last block partly past the end
  check_swiglu<__half>({1000, 0, false, true});
}

}  // namespace
}  // namespace tide::kernels
