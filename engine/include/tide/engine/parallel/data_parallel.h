// Data parallelism over the flat parameter and gradient buffers: gradients averaged
// across the data-parallel group in buckets, and for ZeRO-1 the optimizer state sharded
// (each rank updates its slice of the flat buffer, then all ranks gather the slices).
#pragma once

#include <cstdint>
#include <memory>

#include "tide/engine/config.h"

namespace tide {

class Comm;
class FlatParameters;

class DataParallel {
 public:
  // `flat` must be padded to a multiple of the group size (FlatParameters pad_to).
  DataParallel(Comm& dp, FlatParameters& flat, const ParallelConfig& cfg);
  ~DataParallel();

  // Plain data parallelism: call just before the backward of a step's last micro-batch.
  // Each bucket is then all-reduced as soon as backward has produced all of its
  // gradients, while backward goes on. Every rank must start the collectives in the
  // same order: the first step records the order in which buckets complete (reducing
  // after backward), checks that all ranks saw the same, and later steps launch in it.
  void begin_final_backward();

  // Averages gradients over the group and returns their global L2 norm. Without ZeRO:
  // one all-reduce per bucket of bucket_mb, and every rank holds all averaged
  // gradients. With ZeRO: reduce-scatter per bucket, and each rank holds the averaged
  // gradients of its own slice only (the rest of its buffer is stale). The norm is
  // summed slice by slice in both cases, so both give the same bits.
  double reduce_gradients();
  // Scales the gradients this rank owns (for clipping).
  void scale_gradients(double factor);
  // Sum of a scalar over the group (losses for reporting).
  double sum(double x);

  // The slice of the flat buffers this rank's optimizer owns: all of it without ZeRO.
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  // ZeRO >= 1, after the optimizer stepped this rank's slice: all ranks get all slices.
  void gather_parameters();

  int64_t bytes_sent() const;
  bool overlapping() const;  // true once the launch order is agreed

  // Called by the autograd hook of parameter slot `slot` (public for the hook only).
  void on_gradient_ready(size_t slot);

 private:
  struct Overlap;
  void launch_ready();
  std::unique_ptr<Overlap> overlap_;
  Comm& dp_;
  FlatParameters& flat_;
  ParallelConfig cfg_;
  int64_t bucket_elems_, begin_, end_;
};

}  // namespace tide
