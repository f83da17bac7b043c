// Training batches: the windows of seq_len + 1 tokens a SampleSource names. Sample i's
// dataset and window are a pure function of (seed, i), so the loader's whole state is one
// cursor (sequences consumed): resuming at a cursor reproduces the data order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include <torch/types.h>

#include "tide/engine/config.h"
#include "tide/engine/data/sample_source.h"
#include "tide/engine/data/token_dataset.h"

namespace tide {

struct Batch {
  torch::Tensor tokens;   // [B, T] int64
  // [B, T] int64, tokens shifted by one; kUncountedTarget (linear_cross_entropy.h) where
  // the prediction is left out of the loss (BatchContents::uncounted_document_ends,
  // loss_mask).
  torch::Tensor targets;
  // [B, T] int32, made only when asked (data.document_attention): each input token's
  // document, counted within its row from 0 (TokenSplit::copy_documents). Undefined:
  // attention spans the whole row.
  torch::Tensor documents;
};

// What a batch holds besides its tokens and their next tokens, as the data config says.
struct BatchContents {
  bool documents = false;  // Batch::documents (data.document_attention)
  // data.eod_mask_loss: a document's last token (its end-of-text) does not count its
  // prediction of the next document's first token, which nothing before it in the row
  // tells: that target is kUncountedTarget. Boundaries from the split's index.
  bool uncounted_document_ends = false;
  // data.loss_mask: a target the split's loss mask marks 0 (a prompt's token) is
  // kUncountedTarget. The split must have one.
  bool loss_mask = false;
  // data.document_windows, for validation's windows (make_eval_batch): each starts at a
  // document's first token. (Training's are the SampleSource's.)
  bool document_windows = false;

  static BatchContents of(const DataConfig& data) {
    return {data.document_attention, data.eod_mask_loss, data.loss_mask, data.document_windows};
  }
  // Whether some targets may go uncounted: the loss is then the mean over the counted ones.
  bool uncounts_targets() const { return uncounted_document_ends || loss_mask; }
};

// Builds the batch of samples [first, first + batch) directly (no thread).
Batch make_batch(const SampleSource& samples, int64_t first, int64_t batch, int64_t seq_len,
                 const BatchContents& contents = {});

// Evenly spaced windows covering a split, or with contents.document_windows evenly
// spaced documents' windows; the same every call (validation).
Batch make_eval_batch(const TokenSplit& split, int64_t batch_index, int64_t n_batches, int64_t batch, int64_t seq_len,
                      const BatchContents& contents = {});

class BatchLoader {
 public:
  // Prepares up to `prefetch` batches ahead on a background thread (0: on demand).
  // Data-parallel ranks share one sample sequence: each batch takes the samples
  // [cursor + offset, + batch), then the cursor moves by `stride` (0: batch). With
  // offset = rank * batch and stride = ranks * batch, the ranks together read exactly
  // what one process would. With `pin`, the batches are in page-locked memory (for a GPU:
  // their copy to the device is then queued, not waited for by the host; needs CUDA).
  // `contents`: what each batch holds besides tokens and targets.
  BatchLoader(SampleSource samples, int64_t batch, int64_t seq_len, int64_t cursor, int64_t prefetch,
              int64_t offset = 0, int64_t stride = 0, bool pin = false, const BatchContents& contents = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  Batch next();
  int64_t cursor() const { return cursor_; }  // sequences consumed by all ranks so far

 private:
  void run();
  Batch produce(int64_t first) const;

  const SampleSource samples_;
  int64_t batch_, seq_len_, cursor_, produced_, prefetch_, offset_, stride_;
  bool pin_;
  BatchContents contents_;
  std::deque<Batch> ready_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace tide
