// The compute dtype of a forward pass (precision.compute).
#pragma once

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "tide/engine/config.h"

namespace tide {

// precision.compute for a run on `device`: auto is bf16 on CUDA (the fast path on every GPU
// since Ampere; older ones run it without bf16 tensor cores and should say fp32) and fp32
// on every CPU; anything else as asked. A CPU with bf16 instructions (AVX512-BF16, AMX)
// trains bf16 faster (2.6x on the tiny bench, an AMD EPYC with AVX512-BF16), but auto
// stays fp32 there: a recipe gives the same numbers on every host, and the CPU is where
// references and tests run. The run log says when bf16 would be faster
// (host_bf16_instructions); without those instructions LibTorch's bf16 products are far
// slower than fp32's.
DType resolve_compute_dtype(DType requested, const c10::Device& device);

// The tensor dtype of a resolved compute dtype: float, bfloat16 or half.
c10::ScalarType scalar_type_of(DType compute);

// The instructions this host's cores multiply bf16 with, from /proc/cpuinfo's flags:
// "amx_bf16", "avx512_bf16", or empty where neither is there (or the file cannot be read).
std::string host_bf16_instructions();

// fn() with matmuls in the compute dtype (bf16, fp16: autocast on the host and on CUDA). Each
// fp32 weight is cast once and the copy reused until the innermost WeightCastScope on
// this thread ends, or, outside one, until fn returns. With gradients off nothing is
// cached: a copy made then would carry no path back to its weight.
at::Tensor with_compute_dtype(DType compute, const std::function<at::Tensor()>& fn);

// x in the dtype autocast computes in on x's device while it is on (the residual
// stream's dtype under bf16 compute); x itself otherwise.
at::Tensor in_compute_dtype(const at::Tensor& x);

// A weight as autocast's matmuls see it while autocast is on: the copy in the compute
// dtype, from the cast cache where a matmul would take it from there (for an op that
// autocast does not cast itself, such as a hand-written node); the weight otherwise.
at::Tensor weight_in_compute_dtype(const at::Tensor& weight);

// The weight a hand-written node that keeps it for backward is given: under a
// WeightCastScope its cached copy in the compute dtype, which the cache holds for the
// step anyway; otherwise the weight itself, which the node casts in forward and again in
// backward, so that no copy lives from a layer's forward to its backward (one extra cast
// per weight and micro-batch for 2 bytes a parameter at the peak, as torch.compile's
// partitioner chooses). The node computes in `compute_dtype_for(weight)`.
at::Tensor weight_for_node(const at::Tensor& weight);
// Whether the cast cache holds the weights' copies for the step: a WeightCastScope on
// this thread, with gradients on.
bool weight_casts_kept();
// The dtype autocast computes in on the weight's device while it is on; the weight's own
// dtype otherwise.
at::ScalarType compute_dtype_for(const at::Tensor& weight);

// While one lives on this thread, the bf16 working copy of each weight, made at its first
// use, serves every forward until the scope ends: one cast per weight per optimizer step
// rather than one per micro-batch. The weights must not change while it lives. Inactive:
// copies live for one forward (ZeRO-3, whose point is not to hold the whole model).
class WeightCastScope {
 public:
  explicit WeightCastScope(bool active);
  ~WeightCastScope();
  WeightCastScope(const WeightCastScope&) = delete;
  WeightCastScope& operator=(const WeightCastScope&) = delete;

 private:
  bool active_;
};

// This thread's autocast settings, kept to run code later as it ran then: a recomputation
// in backward, which may run on another thread than the step's scope, runs with the
// forward's settings and without the cast cache.
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kBFloat16;

  static AutocastState current();
  at::Tensor run_uncached(const std::function<at::Tensor()>& fn) const;
};

}  // namespace tide
