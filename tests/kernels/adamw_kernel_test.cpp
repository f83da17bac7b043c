// tide's AdamW kernel (engine/src/kernels/adamw.cu) on the emulated GPU against the host
// kernel (optim/adamw_kernel.cpp): one launch over ranges that move 16 bytes a thread and
// one that moves an element, across chunk boundaries, decayed and plain, clipped and
// skipped, writing the bf16 or fp16 working copy. Both round each operation alike and
// form the step's factors in double: the same bits.
#include <cstring>
#include <type_traits>

#include "adamw_kernel.h"
#include "kernel_test_support.h"

namespace tide::kernels {
namespace {

// The first element whose bits differ, or -1.
template <typename T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;
  for (std::size_t i = 0; i < a.size(); ++i) {
    Bits x, y;
    std::memcpy(&x, &a[i], sizeof x);
    std::memcpy(&y, &b[i], sizeof y);
    if (x != y) return static_cast<int64_t>(i);
  }
  return -1;
}

constexpr double kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1;

template <typename W>
void check_adamw() {
  SCOPED_TRACE(element_name<W>());
  const int64_t n = 200003;
  // The first range 16 bytes at a time, ending past a multiple of 4; the second an
  // element at a time; the third aligned again, over two chunks, its moments elsewhere.
  const std::vector<AdamWRange> ranges{{0, 0, 0, 70001, true, true},
                                       {70001, 70001, 70001, 3, false, false},
                                       {70004, 70004, 70004, n - 70004, true, true}};
  std::vector<AdamWChunk> chunks(static_cast<std::size_t>(adamw_chunks(ranges.data(), 3, nullptr)));
  adamw_chunks(ranges.data(), 3, chunks.data());
  ASSERT_EQ(chunks.size(), 5u);

  auto p_gpu = random_values<float>(n, 11), p_host = p_gpu;
  std::vector<float> m_gpu(n, 0.0f), v_gpu(n, 0.0f), m_host(n, 0.0f), v_host(n, 0.0f), grads(n);
  std::vector<W> copy_gpu(n), copy_host(n);
  const CopyElement copy = std::is_same_v<W, __half> ? CopyElement::f16 : CopyElement::bf16;
  float lr = 0, step = 0, factor = 1, skip = 0;
  AdamWArgs args;
  args.params = p_gpu.data();
  args.grads = grads.data();
  args.exp_avg = m_gpu.data();
  args.exp_avg_sq = v_gpu.data();
  args.working = copy_gpu.data();
  args.working_element = element_of<W>();
  args.lr = &lr;
  args.step = &step;
  args.grad_factor = &factor;
  args.skip = &skip;
  args.beta1 = kBeta1;
  args.beta2 = kBeta2;
  args.eps = kEps;
  args.weight_decay = kWeightDecay;

  int taken = 0;
  for (int k = 0; k < 5; ++k) {
    const auto g = random_values<float>(n, 20 + k, k + 1.0);
    std::copy(g.begin(), g.end(), grads.begin());
    lr = std::ldexp(1.0f, -6 - k % 2);  // exact in the fp32 the kernel reads
    factor = k >= 1 ? 0.5f : 1.0f;
    skip = k == 2 ? 1.0f : 0.0f;
    step = static_cast<float>(taken + 1);
    adamw_update(args, ranges.data(), chunks.data(), static_cast<int64_t>(chunks.size()), nullptr);
    if (skip == 0) {
      ++taken;
      // As optim/adamw.cpp calls the host kernel.
      const double bc1 = 1.0 - std::pow(kBeta1, taken), bc2 = 1.0 - std::pow(kBeta2, taken);
      for (const auto& r : ranges) {
        const double decay = r.decayed ? 1.0 - lr * kWeightDecay : 1.0;
        adamw_update_cpu(p_host.data() + r.param, grads.data() + r.grad, m_host.data() + r.state,
                         v_host.data() + r.state, r.numel, factor, static_cast<float>(decay),
                         static_cast<float>(kBeta1), static_cast<float>(kBeta2), static_cast<float>(kEps),
                         static_cast<float>(lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
                         copy_host.data() + r.param, copy);
      }
    }
    const std::string at = "step " + std::to_string(k);
    EXPECT_EQ(first_difference(p_gpu, p_host), -1) << at << ": parameters";
    EXPECT_EQ(first_difference(m_gpu, m_host), -1) << at << ": exp_avg";
    EXPECT_EQ(first_difference(v_gpu, v_host), -1) << at << ": exp_avg_sq";
    EXPECT_EQ(first_difference(copy_gpu, copy_host), -1) << at << ": working copy";
  }
  EXPECT_EQ(taken, 4);
  // The working copy is the parameters rounded.
  for (int64_t i = 0; i < n; i += 997)
    ASSERT_EQ(to_host_float(copy_gpu[i]), to_host_float(from_host_float<W>(p_gpu[i]))) << "element " << i;
}

TEST(EmulatedKernels, AdamWGivesTheHostKernelsBitsAndWritesTheWorkingCopy) {
  check_adamw<__nv_bfloat16>();
  check_adamw<__half>();
}

}  // namespace
}  // namespace tide::kernels
