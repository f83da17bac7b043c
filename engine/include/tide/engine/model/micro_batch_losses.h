// A step's loss over its micro-batches: what each one's backward starts from, and their
// sum, kept on the losses' device (reading each loss as it comes would make the host wait
// for the device at every micro-batch).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace tide {

class MicroBatchLosses {
 public:
  // Every target counts: each of the n micro-batches' mean losses weighs 1/n.
  explicit MicroBatchLosses(int64_t micro_batches);
  // Some targets go uncounted (data.eod_mask_loss): each micro-batch weighs as its counted
  // targets do among the step's, so the step's loss is the mean over every counted target
  // however the batch is cut into micro-batches and data-parallel ranks (a mean of
  // micro-batch means would weigh a target of a sparser micro-batch more). `counted`: this
  // rank's micro-batches' counts [n]; `step_counted`: the step's, summed over the `ranks`
  // data-parallel ranks (their gradients are averaged: each share is `ranks` times its
  // part of the whole). Both on the losses' device; nothing is read by the host.
  MicroBatchLosses(const at::Tensor& counted, const at::Tensor& step_counted, int64_t ranks);

  // Micro-batch m's loss (a scalar, the mean over its counted targets) as its part of the
  // step's: what backward starts from (before a loss scale). Adds it to the sum, in fp64.
  at::Tensor part(const at::Tensor& loss, int64_t m);
  // Micro-batch m's share of the step: what part() multiplies its loss by (fp64, on
  // `device` where the shares are not counted).
  at::Tensor share(int64_t m, c10::Device device) const;
  // This rank's sum of parts, an fp64 scalar (0 on `device` when nothing was added): the
  // step's loss is its mean over the data-parallel ranks. Not read here.
  at::Tensor total(c10::Device device) const;

 private:
  int64_t micro_batches_;
  at::Tensor shares_;  // [n] fp64; undefined: 1/n each
  at::Tensor sum_;
};

}  // namespace tide
