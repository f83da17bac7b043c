// The datasets a run trains on (config.h: data_sources): data.path alone or a weighted
// blend (data.blend), each opened and checked, all written with one tokenizer. What the
// trainer samples its batches from and validates on, source by source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tide/engine/config.h"
#include "tide/engine/data/sample_source.h"

namespace tide {

class TrainingData {
 public:
  // Opens every dataset (TokenDataset: each split read once), relative paths against
  // the working directory. Throws ConfigError naming the field (data.path,
  // data.blend[i]) and the directory: a dataset that does not open, a tokenizer that
  // differs from the first dataset's (its ids would be other tokens), a train split
  // shorter than one window of data.seq_len + 1 tokens.
  explicit TrainingData(const DataConfig& cfg);
  ~TrainingData();
  TrainingData(const TrainingData&) = delete;
  TrainingData& operator=(const TrainingData&) = delete;

  size_t size() const { return sources_.size(); }
  const TokenDataset& dataset(size_t i) const { return *sources_[i].data; }
  // The source's label (metrics' val_losses) and its share of the training samples.
  const std::string& name(size_t i) const { return sources_[i].name; }
  double share(size_t i) const { return sources_[i].share; }
  int64_t vocab_size() const;
  // The tokenizer file they share (it may be absent from a dataset other tools wrote).
  std::string tokenizer_path() const;
  // Every source's train split, drawn by share; windows at document starts where asked
  // (data.document_windows).
  SampleSource train_samples(uint64_t seed, bool document_windows = false) const;

 private:
  struct Source {
    std::string name;
    double share = 1;
    std::unique_ptr<TokenDataset> data;
  };
  std::vector<Source> sources_;
};

// What can be checked of a recipe's data without reading its token files (a daemon, at
// submit): each dataset's dataset.json (TokenDataset::read_checked_meta), one tokenizer
// for all, train splits (as recorded) that hold a window. Relative paths against
// `workdir`; with `leave_unseen`, a directory that is not there is left to the workers
// (Slurm's nodes may mount what the caller does not). Throws ConfigError as TrainingData
// does.
void check_training_data(const DataConfig& cfg, const std::string& workdir, bool leave_unseen);

}  // namespace tide
