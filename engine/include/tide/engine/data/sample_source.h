// Which window of which dataset each training sample is: random windows of seq_len + 1
// tokens, deterministic given the seed, from one split or a weighted blend of several
// (data.blend). No LibTorch: the batches are the loader's (batch_loader.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tide/engine/data/token_dataset.h"

namespace tide {

// Throws unless `split` holds one window of seq_len + 1 tokens.
void require_window(const TokenSplit& split, int64_t seq_len);

// Start of sample `index`'s window in a split of n tokens.
int64_t window_start(uint64_t seed, int64_t index, int64_t n_tokens, int64_t seq_len);

// Where each training sample comes from: one split, or a blend of several, each drawn
// for a share of the samples given by its weight. Sample i's draw is the i-th point of
// a golden-ratio (Kronecker) sequence in [0, 1) against the weights' cumulative shares,
// so every run of n consecutive samples, a step's batch among them, holds each split's
// share of n to within O(log n) samples, and a pure function of (seed, i) as resuming
// needs. Its window is then random within that split (window_start, seeded apart per
// split; a single split's windows are those of a blend of one).
// With `document_windows` (data.document_windows) a window starts at a document's first
// token instead: a document drawn at random (seeded as above) among those that start a
// whole window.
class SampleSource {
 public:
  SampleSource(const TokenSplit& split, uint64_t seed, bool document_windows = false);
  // `weights`: positive, one a split; they need not sum to 1.
  SampleSource(std::vector<const TokenSplit*> splits, const std::vector<double>& weights, uint64_t seed,
               bool document_windows = false);

  size_t splits() const { return splits_.size(); }
  // Which split sample `index` is drawn from.
  size_t split_of(int64_t index) const;
  // Its split and its window's first token.
  std::pair<const TokenSplit*, int64_t> window(int64_t index, int64_t seq_len) const;
  // Throws unless every split holds a window of seq_len + 1 tokens.
  void check(int64_t seq_len) const;

 private:
  std::vector<const TokenSplit*> splits_;
  // A draw below bounds_[d] (and not below an earlier bound) takes split d; the last
  // split takes the draws above every bound. 2^64 fixed point: the same on every machine.
  std::vector<uint64_t> bounds_;
  uint64_t seed_, phase_;
  bool document_windows_;
};

}  // namespace tide
