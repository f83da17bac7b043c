#include "tide/engine/data/batch_loader.h"

#include <stdexcept>
#include <string>

#include <torch/types.h>

namespace tide {
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void check_split(const TokenSplit& split, int64_t seq_len) {
  if (split.size() < seq_len + 1)
    throw std::runtime_error("a split of " + std::to_string(split.size()) + " tokens is shorter than one window of " +
                             std::to_string(seq_len + 1) + " tokens (data.seq_len + 1)");
}
}  // namespace

int64_t window_start(uint64_t seed, int64_t index, int64_t n_tokens, int64_t seq_len) {
  const uint64_t span = static_cast<uint64_t>(n_tokens - seq_len);  // starts in [0, n - T - 1]
  return static_cast<int64_t>(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(index)) % span);
}

namespace {
Batch fill(const TokenSplit& split, int64_t batch, int64_t seq_len, const std::function<int64_t(int64_t)>& start_of) {
  auto buf = torch::empty({batch, seq_len + 1}, torch::kInt64);
  auto* p = buf.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) split.copy(start_of(b), seq_len + 1, p + b * (seq_len + 1));
  return {buf.narrow(1, 0, seq_len).contiguous(), buf.narrow(1, 1, seq_len).contiguous()};
}
}  // namespace

Batch make_batch(const TokenSplit& split, uint64_t seed, int64_t first, int64_t batch, int64_t seq_len) {
  check_split(split, seq_len);
  return fill(split, batch, seq_len,
              [&](int64_t b) { return window_start(seed, first + b, split.size(), seq_len); });
}

Batch make_eval_batch(const TokenSplit& split, int64_t batch_index, int64_t n_batches, int64_t batch,
                      int64_t seq_len) {
  check_split(split, seq_len);
  const int64_t windows = n_batches * batch;
  const int64_t span = split.size() - seq_len - 1;
  return fill(split, batch, seq_len, [&](int64_t b) {
    const int64_t w = batch_index * batch + b;
    return windows > 1 ? span * w / (windows - 1) : 0;
  });
}

BatchLoader::BatchLoader(const TokenSplit& split, uint64_t seed, int64_t batch, int64_t seq_len, int64_t cursor,
                         int64_t prefetch, int64_t offset, int64_t stride, bool pin)
    : split_(split),
      seed_(seed),
      batch_(batch),
      seq_len_(seq_len),
      cursor_(cursor),
      produced_(cursor),
      prefetch_(prefetch),
      offset_(offset),
      stride_(stride > 0 ? stride : batch),
      pin_(pin) {
  check_split(split, seq_len);
  if (prefetch_ > 0) worker_ = std::thread([this] { run(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void BatchLoader::run() {
  for (;;) {
    int64_t first;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(ready_.size()) < prefetch_; });
      if (stop_) return;
      first = produced_ + offset_;
      produced_ += stride_;
    }
    Batch b = produce(first);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(b));
    }
    cv_.notify_all();
  }
}

Batch BatchLoader::produce(int64_t first) const {
  Batch b = make_batch(split_, seed_, first, batch_, seq_len_);
  if (pin_) {
    b.tokens = b.tokens.pin_memory();
    b.targets = b.targets.pin_memory();
  }
  return b;
}

Batch BatchLoader::next() {
  if (prefetch_ == 0) {
    Batch b = produce(cursor_ + offset_);
    cursor_ += stride_;
    return b;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty(); });
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  cursor_ += stride_;
  lock.unlock();
  cv_.notify_all();
  return b;
}

}  // namespace tide
