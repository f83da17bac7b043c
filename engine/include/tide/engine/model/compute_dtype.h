// The compute dtype of a forward pass (precision.compute).
#pragma once

#include <functional>
#include <string>
#include <vector>

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

// fn() with matmuls in the compute dtype (bf16, fp16: autocast on the host and on CUDA).
// tide's own nodes take the fp32 weights and cast them with working_copy; what autocast
// casts itself (an op tide does not write) is cast once and reused until fn returns, with
// gradients on.
at::Tensor with_compute_dtype(DType compute, const std::function<at::Tensor()>& fn);

// x in the dtype autocast computes in on x's device while it is on (the residual
// stream's dtype under bf16 compute); x itself otherwise.
at::Tensor in_compute_dtype(const at::Tensor& x);

// The copy of an fp32 weight in `dtype` that a node multiplies by, made with gradients
// off: the node computes the weight's gradient itself (weight_gradient.h). While the
// thread that makes it holds a WeightCastScope, the copy is kept for the scope and every
// later call for that weight, in forward, backward or a recomputation and on any thread
// (autograd's device threads), gets it; otherwise each call casts afresh, so that no
// copy lives from a layer's forward to its backward.
at::Tensor working_copy(const at::Tensor& weight, at::ScalarType dtype);
// The dtype autocast computes in on the weight's device while it is on; the weight's own
// dtype otherwise.
at::ScalarType compute_dtype_for(const at::Tensor& weight);

// Working copies that outlive a step: views of a buffer in a compute dtype that their
// owner keeps equal to the weights (AdamW writes both in one pass). Each serves
// working_copy while neither its weight's version nor base's (the flat buffer the weights
// view; undefined: none) has moved since it was kept, so that a weight changed any other
// way (a checkpoint loaded into it) is cast afresh until the owner keeps them again.
struct StandingCopy {
  at::Tensor weight, copy;
};
void keep_working_copies(const void* owner, const at::Tensor& base, const std::vector<StandingCopy>& copies);
void drop_working_copies(const void* owner);

// An optimizer step's working copies: while one lives on this thread, each weight is cast
// once, at its first use, and the copy serves every micro-batch's forward and backward
// until the scope ends (2 bytes a parameter held through the step, for one cast per weight
// per step instead of two per micro-batch). The weights must not change while it lives
// (a copy whose weight's version moved is made again). Inactive: no copies are kept
// (ZeRO-3, whose point is not to hold the whole model).
class WeightCastScope {
 public:
  explicit WeightCastScope(bool active);
  ~WeightCastScope();
  WeightCastScope(const WeightCastScope&) = delete;
  WeightCastScope& operator=(const WeightCastScope&) = delete;

 private:
  bool active_;
  WeightCastScope* outer_ = nullptr;
};

// This thread's autocast settings, kept to run code later as it ran then: a recomputation
// in backward, which may run on another thread than the step's scope, runs with the
// forward's settings and without autocast's cast cache.
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kBFloat16;

  static AutocastState current();
  at::Tensor run_uncached(const std::function<at::Tensor()>& fn) const;
};

}  // namespace tide
