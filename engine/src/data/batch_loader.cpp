#include "tide/engine/data/batch_loader.h"

#include <functional>

#include <torch/types.h>

#include "tide/engine/model/linear_cross_entropy.h"

namespace tide {
namespace {
// Row b of the batch is the window of seq_len + 1 tokens window_of(b) gives: its split
// and its first token.
Batch fill(int64_t batch, int64_t seq_len, const BatchContents& contents,
           const std::function<std::pair<const TokenSplit*, int64_t>(int64_t)>& window_of) {
  auto buf = torch::empty({batch, seq_len + 1}, torch::kInt64);
  // Each window's documents, its last token's too: the inputs' are the first seq_len, and
  // target i starts a document where its number moves on from input i's.
  const bool any_documents = contents.documents || contents.uncounted_document_ends;
  torch::Tensor window_documents;
  if (any_documents) window_documents = torch::empty({batch, seq_len + 1}, torch::kInt32);
  // The targets' loss mask: whether each of the window's last seq_len tokens counts.
  torch::Tensor counted;
  if (contents.loss_mask) counted = torch::empty({batch, seq_len}, torch::kUInt8);
  auto* p = buf.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const auto [split, start] = window_of(b);
    split->copy(start, seq_len + 1, p + b * (seq_len + 1));
    if (any_documents)
      split->copy_documents(start, seq_len + 1, window_documents.data_ptr<int32_t>() + b * (seq_len + 1));
    if (contents.loss_mask) split->copy_loss_mask(start + 1, seq_len, counted.data_ptr<uint8_t>() + b * seq_len);
  }
  auto targets = buf.narrow(1, 1, seq_len).contiguous();
  if (contents.loss_mask) targets.masked_fill_(counted.eq(0), kUncountedTarget);
  if (contents.uncounted_document_ends) {
    const auto starts = window_documents.narrow(1, 1, seq_len).ne(window_documents.narrow(1, 0, seq_len));
    targets.masked_fill_(starts, kUncountedTarget);
  }
  torch::Tensor documents;
  if (contents.documents) documents = window_documents.narrow(1, 0, seq_len).contiguous();
  return {buf.narrow(1, 0, seq_len).contiguous(), std::move(targets), documents};
}
}  // namespace

Batch make_batch(const SampleSource& samples, int64_t first, int64_t batch, int64_t seq_len,
                 const BatchContents& contents) {
  samples.check(seq_len);
  return fill(batch, seq_len, contents, [&](int64_t b) { return samples.window(first + b, seq_len); });
}

Batch make_eval_batch(const TokenSplit& split, int64_t batch_index, int64_t n_batches, int64_t batch, int64_t seq_len,
                      const BatchContents& contents) {
  require_window(split, seq_len);
  const int64_t windows = n_batches * batch;
  const int64_t span = split.size() - seq_len - 1;
  // The documents that start a whole window (document 0 at least).
  const int64_t documents = contents.document_windows ? split.documents_starting_by(span) : 0;
  return fill(batch, seq_len, contents, [&](int64_t b) {
    const int64_t w = batch_index * batch + b;
    if (contents.document_windows)
      return std::make_pair(&split, split.document_start(windows > 1 ? (documents - 1) * w / (windows - 1) : 0));
    return std::make_pair(&split, windows > 1 ? span * w / (windows - 1) : 0);
  });
}

BatchLoader::BatchLoader(SampleSource samples, int64_t batch, int64_t seq_len, int64_t cursor, int64_t prefetch,
                         int64_t offset, int64_t stride, bool pin, const BatchContents& contents)
    : samples_(std::move(samples)),
      batch_(batch),
      seq_len_(seq_len),
      cursor_(cursor),
      produced_(cursor),
      prefetch_(prefetch),
      offset_(offset),
      stride_(stride > 0 ? stride : batch),
      pin_(pin),
      contents_(contents) {
  samples_.check(seq_len);
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
  Batch b = make_batch(samples_, first, batch_, seq_len_, contents_);
  if (pin_) {
    b.tokens = b.tokens.pin_memory();
    b.targets = b.targets.pin_memory();
    if (b.documents.defined()) b.documents = b.documents.pin_memory();
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
