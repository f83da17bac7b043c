// AdamW over the ranges of flat fp32 buffers in one launch, reading its step's scalars
// (learning rate, step count, clipping factor, skip flag) on the device, and writing the
// weights' working copy in the compute dtype as it writes the weights. A block takes one
// chunk of one range; a thread moves 16 bytes of each fp32 buffer at a time where the
// range's offsets allow it.
#include <cstdint>
#include <cstring>

#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 256;

struct Step {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2, grad_factor, decay;
};

// In double, as the host forms them: 1 - beta^t loses most of its digits in fp32 at the
// first steps (1 - 0.999f is 0.00099999 where 1 - 0.999 is 0.001).
__device__ __forceinline__ Step step_of(const AdamWArgs& a) {
  Step s;
  const double lr = *a.lr, t = *a.step;
  s.beta1 = static_cast<float>(a.beta1);
  s.beta2 = static_cast<float>(a.beta2);
  s.eps = static_cast<float>(a.eps);
  s.step_size = static_cast<float>(lr / (1.0 - pow(a.beta1, t)));
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / sqrt(1.0 - pow(a.beta2, t)));
  s.grad_factor = a.grad_factor ? *a.grad_factor : 1.0f;
  s.decay = static_cast<float>(1.0 - lr * a.weight_decay);
  return s;
}

// The update of one element, operation for operation the host kernel's
// (optim/adamw_kernel.cpp, built without contraction): each rounded to nearest, none
// fused into a multiply-add, so both give the same bits.
__device__ __forceinline__ void update(float& p, float g, float& m, float& v, float decay, const Step& s) {
  g = __fmul_rn(g, s.grad_factor);
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(1.0f - s.beta1, g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(1.0f - s.beta2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), s.inv_sqrt_bc2), s.eps);
  p = __fsub_rn(__fmul_rn(p, decay), __fdiv_rn(__fmul_rn(s.step_size, m), denom));
}

template <typename W>
__device__ __forceinline__ void write_copy(void* working, int64_t i, float p) {
  static_cast<W*>(working)[i] = from_float<W>(p);
}

// Four elements in one 8-byte store: as a struct of four (or through a cast to uint2) nvcc
// splits them into narrower stores; their bits built into one 64-bit word it does not.
template <typename W>
__device__ __forceinline__ void write_copy4(void* working, int64_t i, float4 p) {
  W* at = static_cast<W*>(working) + i;
  if constexpr (sizeof(W) == 4) {
    *reinterpret_cast<float4*>(at) = p;
  } else {
    static_assert(sizeof(W) == 2, "a working copy's element is 2 or 4 bytes");
    const auto bits = [](float v) {
      const W w = from_float<W>(v);
      uint16_t b;
      memcpy(&b, &w, sizeof b);
      return static_cast<uint64_t>(b);
    };
    *reinterpret_cast<uint64_t*>(at) = bits(p.x) | bits(p.y) << 16 | bits(p.z) << 32 | bits(p.w) << 48;
  }
}

// W: the working copy's element (float where there is none: never written).
template <typename W>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(AdamWArgs a, const AdamWRange* __restrict__ ranges, const AdamWChunk* __restrict__ chunks) {
  if (a.skip && *a.skip != 0.0f) return;
  const Step s = step_of(a);
  const AdamWChunk c = chunks[blockIdx.x];
  const AdamWRange r = ranges[c.range];
  const float decay = r.decayed ? s.decay : 1.0f;
  const int64_t first = c.first, end = first + c.numel;  // within the range
  float* __restrict__ p = a.params + r.param;
  const float* __restrict__ g = a.grads + r.grad;
  float* __restrict__ m = a.exp_avg + r.state;
  float* __restrict__ v = a.exp_avg_sq + r.state;
  const bool copy = a.working != nullptr;
  int64_t i = first + 4 * static_cast<int64_t>(threadIdx.x);
  if (r.packed) {
    for (; i + 4 <= end; i += 4 * kThreads) {
      float4 pp = *reinterpret_cast<float4*>(p + i);
      const float4 gg = *reinterpret_cast<const float4*>(g + i);
      float4 mm = *reinterpret_cast<float4*>(m + i), vv = *reinterpret_cast<float4*>(v + i);
      update(pp.x, gg.x, mm.x, vv.x, decay, s);
      update(pp.y, gg.y, mm.y, vv.y, decay, s);
      update(pp.z, gg.z, mm.z, vv.z, decay, s);
      update(pp.w, gg.w, mm.w, vv.w, decay, s);
      *reinterpret_cast<float4*>(p + i) = pp;
      *reinterpret_cast<float4*>(m + i) = mm;
      *reinterpret_cast<float4*>(v + i) = vv;
      if (copy) write_copy4<W>(a.working, r.param + i, pp);
    }
    // The range's last elements past a multiple of 4: one thread's four at most.
    if (i < end)
      for (; i < end; ++i) {
        update(p[i], g[i], m[i], v[i], decay, s);
        if (copy) write_copy<W>(a.working, r.param + i, p[i]);
      }
    return;
  }
  for (i = first + threadIdx.x; i < end; i += kThreads) {
    update(p[i], g[i], m[i], v[i], decay, s);
    if (copy) write_copy<W>(a.working, r.param + i, p[i]);
  }
}

}  // namespace

int64_t adamw_chunks(const AdamWRange* ranges, int64_t n_ranges, AdamWChunk* out) {
  int64_t n = 0;
  for (int64_t k = 0; k < n_ranges; ++k)
    for (int64_t first = 0; first < ranges[k].numel; first += kAdamWChunk, ++n)
      if (out) {
        out[n].range = k;
        out[n].first = first;
        out[n].numel = ranges[k].numel - first < kAdamWChunk ? ranges[k].numel - first : kAdamWChunk;
      }
  return n;
}

void adamw_update(const AdamWArgs& args, const AdamWRange* ranges, const AdamWChunk* chunks, int64_t n_chunks,
                  cudaStream_t stream) {
  if (n_chunks == 0) return;
  if (args.working && reinterpret_cast<std::uintptr_t>(args.working) % 8 != 0)
    throw std::runtime_error("adamw_update: the working copy must be 8-byte aligned");
  const auto blocks = static_cast<unsigned>(n_chunks);
  if (n_chunks > 0x7fffffff) throw std::runtime_error("adamw_update: too many chunks");
  if (!args.working || args.working_element == Element::F32) {
    AdamWArgs a = args;
    a.working = nullptr;
    launch(adamw_kernel<float>, blocks, kThreads, 0, stream, a, ranges, chunks);
  } else if (args.working_element == Element::BF16) {
    launch(adamw_kernel<__nv_bfloat16>, blocks, kThreads, 0, stream, args, ranges, chunks);
  } else {
    launch(adamw_kernel<__half>, blocks, kThreads, 0, stream, args, ranges, chunks);
  }
  check_launch("adamw_update");
}

}  // namespace tide::kernels
