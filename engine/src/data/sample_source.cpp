#include "tide/engine/data/sample_source.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace tide {
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Sample `index`'s draw among n choices, a pure function of (seed, index).
uint64_t draw(uint64_t seed, int64_t index, uint64_t n) {
  return splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(index)) % n;
}
}  // namespace

void require_window(const TokenSplit& split, int64_t seq_len) {
  if (split.size() < seq_len + 1)
    throw std::runtime_error("a split of " + std::to_string(split.size()) + " tokens is shorter than one window of " +
                             std::to_string(seq_len + 1) + " tokens (data.seq_len + 1)");
}

int64_t window_start(uint64_t seed, int64_t index, int64_t n_tokens, int64_t seq_len) {
  const uint64_t span = static_cast<uint64_t>(n_tokens - seq_len);  // starts in [0, n - T - 1]
  return static_cast<int64_t>(draw(seed, index, span));
}

namespace {
// 2^64 / golden ratio, odd: its multiples modulo 2^64 are the Kronecker sequence of the
// golden ratio in fixed point, the most evenly spread of such sequences.
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// Seeds split d's windows apart from split 0's (which keep the single split's seed).
constexpr uint64_t kSplitSalt = 0xD1B54A32D192ED03ull;
}  // namespace

SampleSource::SampleSource(const TokenSplit& split, uint64_t seed, bool document_windows)
    : SampleSource({&split}, {1.0}, seed, document_windows) {}

SampleSource::SampleSource(std::vector<const TokenSplit*> splits, const std::vector<double>& weights, uint64_t seed,
                           bool document_windows)
    : splits_(std::move(splits)), seed_(seed), phase_(splitmix64(seed ^ kGolden)), document_windows_(document_windows) {
  if (splits_.empty() || weights.size() != splits_.size())
    throw std::invalid_argument("a sample source needs one weight for each of one or more splits");
  double total = 0;
  for (const double w : weights) {
    if (!(w > 0) || !std::isfinite(w)) throw std::invalid_argument("a split's weight must be finite and above 0");
    total += w;
  }
  double below = 0;
  for (size_t d = 0; d + 1 < weights.size(); ++d) {
    below += weights[d] / total;
    // ldexp(x, 64) of x in [0, 1) is below 2^64; a sum rounded up to 1 takes every draw.
    bounds_.push_back(below >= 1.0 ? UINT64_MAX : static_cast<uint64_t>(std::ldexp(below, 64)));
  }
}

size_t SampleSource::split_of(int64_t index) const {
  const uint64_t draw = static_cast<uint64_t>(index) * kGolden + phase_;  // modulo 2^64
  for (size_t d = 0; d < bounds_.size(); ++d)
    if (draw < bounds_[d]) return d;
  return bounds_.size();
}

std::pair<const TokenSplit*, int64_t> SampleSource::window(int64_t index, int64_t seq_len) const {
  const size_t d = split_of(index);
  const TokenSplit* split = splits_[d];
  const uint64_t seed = seed_ ^ (d * kSplitSalt);
  if (!document_windows_) return {split, window_start(seed, index, split->size(), seq_len)};
  // Document 0 starts at 0, so a split that holds a window has one such document.
  const int64_t starts = split->documents_starting_by(split->size() - seq_len - 1);
  return {split, split->document_start(static_cast<int64_t>(draw(seed, index, static_cast<uint64_t>(starts))))};
}

void SampleSource::check(int64_t seq_len) const {
  for (const auto* split : splits_) require_window(*split, seq_len);
}

}  // namespace tide
