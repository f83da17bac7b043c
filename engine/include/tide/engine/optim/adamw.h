// AdamW (decoupled weight decay) over ranges of flat fp32 buffers, and the gate that
// clips or skips its step from values that stay on the gradients' device.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "tide/engine/config.h"
#include "tide/engine/optim/flat_parameters.h"

namespace tide {

// What an optimizer step does with the gradients it is given, decided on their device so
// that the host never waits for the gradient norm: the factor that clips them and whether
// the step is skipped (the parameters, moments and step count then stay as they were).
struct UpdateGate {
  torch::Tensor clip;  // fp64 scalar; undefined: 1
  torch::Tensor skip;  // bool scalar; undefined: the step is taken
};

// The gate for gradients of global L2 norm `norm` (an fp64 scalar on their device):
// clipped to max_norm (0: never), skipped where the norm is not finite or `skip` is set.
UpdateGate gate_update(const torch::Tensor& norm, double max_norm, const torch::Tensor& skip = {});

// How the update runs: one vectorised pass per segment on the host's cores, reading the
// gate there (CPU parameters, and offload); PyTorch's fused multi-tensor AdamW on the
// parameters' device, gated there, with the step count a device scalar; or, on CUDA where
// tide's kernels are built, tide's: one launch over every segment, gated on the device
// like PyTorch's, which also writes the weights' working copy (keep_working_copy).
// automatic: host for CPU parameters and offload, else tide's kernel where built, else
// PyTorch's.
enum class AdamWKernel { automatic, host, fused, device };

class AdamW {
 public:
  // Updates `segments` of the 1-D buffers `params` and `grads` (the whole model, or the
  // pieces a ZeRO rank owns); the moments are held for those elements only.
  // offload: an fp32 master copy of the segments and the moments live in host memory
  // (pinned when the parameters are on a GPU), the update runs there on the host's
  // cores, and the result is copied back to the parameters' device.
  AdamW(torch::Tensor params, torch::Tensor grads, std::vector<OptimSegment> segments, const OptimConfig& cfg,
        bool offload = false, AdamWKernel kernel = AdamWKernel::automatic);
  // The whole of a FlatParameters.
  AdamW(FlatParameters& flat, const OptimConfig& cfg, bool offload = false,
        AdamWKernel kernel = AdamWKernel::automatic);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // Keeps the weights' working copy in `dtype` (bf16, fp16: the compute dtype) in a buffer
  // beside params() that every update writes in the same pass as the weights, and offers
  // each slot's view of it to working_copy (compute_dtype.h): the forward and backward
  // then cast nothing (2 bytes a parameter, held for the run). Only where this optimizer
  // updates every element the slots view (not a ZeRO shard, not offloaded) with a kernel
  // that writes the copy (host, device); returns whether it keeps one. The copies are
  // offered while neither a weight nor params() changed otherwise (restore() takes them
  // again after a checkpoint is loaded).
  bool keep_working_copy(at::ScalarType dtype, const std::vector<FlatParameters::Slot>& slots);

  // One update with learning rate `lr` (weight decay, betas and eps from config()), the
  // gradients clipped and the step skipped as `gate` says.
  void step(double lr, const UpdateGate& gate = {});
  // The same with the learning rate a floating-point scalar tensor: the fused kernel reads
  // it on the parameters' device (as fp32) when it runs, so a captured update (CUDA
  // graphs) takes the value written there before each replay; the host kernel reads it
  // on the host.
  void step(const torch::Tensor& lr, const UpdateGate& gate = {});
  // Whether the update runs on the parameters' device without reading anything on the
  // host (the fused kernel), as a captured step needs.
  bool runs_on_device() const { return fused_; }
  int64_t numel() const { return m_.numel(); }
  // The updates taken (skipped ones not counted); the fused kernel's count is read from
  // its device.
  int64_t steps_taken() const;
  // Bytes of optimizer state: the moments, and with offload the host master and
  // gradient copies.
  int64_t state_bytes() const;
  OptimConfig& config() { return cfg_; }

  torch::Tensor& exp_avg() { return m_; }
  torch::Tensor& exp_avg_sq() { return v_; }
  // The buffer of parameters it updates (segments' param_offset index it).
  torch::Tensor& params() { return params_; }
  // After a checkpoint was loaded into params() and the moments: the step count, and
  // with offload the host master copy, or the working copy, taken again from params().
  void restore(int64_t steps_taken);

 private:
  torch::Tensor params_, grads_;
  std::vector<OptimSegment> segments_;
  OptimConfig cfg_;
  torch::Tensor m_, v_;
  torch::Tensor host_master_, host_grad_;  // offload only
  bool fused_ = false;                     // the update runs on the parameters' device, gated there
  bool own_kernel_ = false;                // tide's CUDA kernel rather than PyTorch's
  // keep_working_copy's buffer and the slots whose views of it are offered.
  torch::Tensor working_;
  std::vector<FlatParameters::Slot> working_slots_;
  // tide's kernel's ranges and chunks (fused_kernels.h), in device memory.
  torch::Tensor kernel_ranges_, kernel_chunks_;
  int64_t kernel_chunk_count_ = 0;
  std::pair<const void*, const void*> kernel_bases_;  // the parameters' and gradients' addresses they fit
  int64_t t_ = 0;        // the host kernel's step count
  torch::Tensor steps_;  // the fused kernel's: an fp32 scalar on the parameters' device
  // The fused kernel's tensor lists (views of the buffers), made once: the decayed
  // segments' group and the others'.
  struct FusedGroup {
    bool decayed = false;
    std::vector<torch::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
  };
  std::vector<FusedGroup> fused_groups_;
  template <typename Lr>
  void fused_step(const Lr& lr, const UpdateGate& gate);
  void own_kernel_step(const torch::Tensor& lr, const std::optional<torch::Tensor>& grad_factor,
                       const std::optional<torch::Tensor>& skip);
  void offer_working_copy();
  void lay_out_kernel_ranges();
};

}  // namespace tide
